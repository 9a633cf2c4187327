"""Multi-turn chats against the appliance and llama-server: is each earlier turn read once?

Several conversations share one system prompt (about 400 tokens). Each turn sends
the whole conversation so far (system prompt, earlier questions, the answers the
server itself gave, the new question) as a streaming ``/v1/chat/completions``,
greedy, as a chat client does. Both servers are loaded at once (the appliance's
daemon with its response cache off, and llama-server ``-np 8`` with its default
``cache_prompt``), built from the same llama.cpp sources with the same flags; the
conversations alternate between them.

Printed per server: the prompt tokens sent and the ones the engine reused from its
prefix cache (``usage.prompt_tokens_details.cached_tokens``; llama-server's
``timings.cache_n``), the hit rate on turns after the first, the tokens read per
turn against the tokens that were new in that turn, and the median TTFT of a
later turn against the same conversation sent cold (a unique first line defeats
every prefix cache), which is the time the reuse saves.

    python tests/bench/bench_multi_turn.py [--conversations 4] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.compare_servers import (  # noqa: E402
    build_llama_server,
    free_port,
    fresh_model_copy,
    start_comparison_daemon,
    start_llama_server_np8,
    stop_process,
)

SYSTEM = "You are the help desk of a hardware shop. " + " ".join(
    f"Policy {i}: items of category {i} may be returned within {i + 14} days with the receipt, and store credit is "
    "offered otherwise."
    for i in range(16)
)
QUESTIONS = [
    "I bought a drill last week and it stopped working. What can I do?",
    "The receipt is lost, but I paid by card. Does that change anything?",
    "Which policy covers garden tools, and how long do I have?",
    "Can you summarise what I need to bring to the shop?",
    "Is store credit transferable to my partner?",
    "Thanks. One last thing: are the opening hours on the receipt?",
    "And can I return an opened pack of screws?",
    "What about a ladder bought during the sale?",
]
MAX_TOKENS = 40


@dataclass
class Server:
    name: str
    url: str
    key: str | None = None
    model: str = "default"
    turns: list[dict[str, float]] = field(default_factory=list)  # turn, prompt, cached, new, ttft
    cold: list[tuple[float, float]] = field(default_factory=list)  # (warm TTFT, cold TTFT) of the same conversation


def ask(server: Server, messages: list[dict[str, str]]) -> tuple[str, float, int, int, int]:
    """Send one streaming chat; return the answer, TTFT, prompt tokens, reused prompt tokens and answer tokens."""
    body = {
        "model": server.model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {server.key}"} if server.key else {}
    started = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    prompt = cached = -1
    completion = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not ttft:
                        ttft = time.perf_counter() - started
                    text.append(piece)
            usage = chunk.get("usage")
            if usage:
                prompt = int(usage.get("prompt_tokens", prompt))
                completion = int(usage.get("completion_tokens", completion))
                details = usage.get("prompt_tokens_details") or {}
                if "cached_tokens" in details:
                    cached = int(details["cached_tokens"])
            timings = chunk.get("timings")
            if timings and cached < 0 and "cache_n" in timings:
                cached = int(timings["cache_n"])
                prompt = max(prompt, int(timings.get("prompt_n", 0)) + cached)
    if prompt < 0 or cached < 0:
        raise RuntimeError(f"{server.name} reported no prompt / cached token counts")
    return "".join(text), ttft, prompt, cached, completion


def converse(server: Server, index: int, turns: int) -> None:
    """One conversation of ``turns`` turns; then its last turn again, cold."""
    messages = [{"role": "system", "content": SYSTEM}]
    previous_prompt = 0
    last_ttft = 0.0
    for turn in range(turns):
        question = f"(conversation {index}) " + QUESTIONS[turn % len(QUESTIONS)]
        messages.append({"role": "user", "content": question})
        answer, ttft, prompt, cached, completion = ask(server, messages)
        messages.append({"role": "assistant", "content": answer})
        server.turns.append({"turn": turn, "prompt": prompt, "cached": cached, "new": prompt - previous_prompt, "ttft": ttft})
        previous_prompt = prompt + completion  # the answer comes back as history in the next turn
        last_ttft = ttft
    cold = [{"role": "system", "content": f"Session {time.time_ns()}. " + SYSTEM}, *messages[1:-1]]
    _, cold_ttft, _, cold_cached, _ = ask(server, cold)
    if cold_cached > 8:
        print(f"  note: {server.name}'s cold turn reused {cold_cached} tokens", flush=True)
    server.cold.append((last_ttft, cold_ttft))


def report(servers: list[Server]) -> None:
    print(
        "\n| server | prompt tokens sent | reused | hit rate after turn 1 | read / new per later turn | "
        "last turn TTFT warm | same prompt cold | saved |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in servers:
        later = [t for t in s.turns if t["turn"] > 0]
        sent = sum(t["prompt"] for t in s.turns)
        reused = sum(t["cached"] for t in s.turns)
        hit = sum(t["cached"] for t in later) / max(1, sum(t["prompt"] for t in later))
        read = statistics.median(t["prompt"] - t["cached"] for t in later)
        new = statistics.median(t["new"] for t in later)
        warm = statistics.median(w for w, _ in s.cold)
        cold = statistics.median(c for _, c in s.cold)
        print(
            f"| {s.name} | {sent:.0f} | {reused:.0f} | {hit:.1%} | {read:.0f} / {new:.0f} | {warm:.2f} s | {cold:.2f} s "
            f"| {1 - warm / cold:.0%} |"
        )
    first = [statistics.median(t["ttft"] for t in s.turns if t["turn"] == 0) for s in servers]
    print(
        "\nmedian TTFT of turn 1 (system prompt shared after the first conversation): "
        + ", ".join(f"{s.name} {v:.2f} s" for s, v in zip(servers, first, strict=True))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=4, help="per server")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--llama-server", type=Path)
    args = parser.parse_args()
    binary = args.llama_server or build_llama_server()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(fresh_model_copy(Path(tmp)))
        port = free_port()
        server = daemon = None
        try:
            server = start_llama_server_np8(binary, model, port)
            daemon = start_comparison_daemon(Path(tmp))
            servers = [
                Server("appliance", daemon.url, key=daemon.create_key("bench")),
                Server("llama-server", f"http://127.0.0.1:{port}"),
            ]
            for s in servers:  # loads and warms up; not counted
                ask(s, [{"role": "user", "content": f"warm up {time.time_ns()}"}])
            for i in range(args.conversations):
                for s in servers if i % 2 == 0 else servers[::-1]:
                    converse(s, i, args.turns)
                print(f"conversation {i + 1}/{args.conversations} done", flush=True)
        finally:
            if daemon is not None:
                daemon.stop()
            if server is not None:
                stop_process(server)
    print(f"\n{args.conversations} conversations of {args.turns} turns per server, interleaved; {MAX_TOKENS} new tokens a turn")
    report(servers)


if __name__ == "__main__":
    main()
