"""A document read on a quiet box: time to the first token, the appliance against llama-server.

    python tests/bench/bench_documents.py [--rounds 3] [--words 300 600 1000 1800]

Both servers loaded at once as the serving comparisons run them (the appliance's
daemon and ``llama-server -np 8``, 2 threads, 8 slots), nothing else in flight. Each
round sends, for every size, one prompt of that many words from the mixed traffic's
vocabulary (``bench_mixed_traffic.WORDS``, a distinct head so no prefix is reused)
to each server in turn, the first alternating by round, one second apart, asking for
4 tokens. Prints per size the prompt's tokens (llama-server's ``/tokenize``) and the
median TTFT of each server, with the prompt tokens read per second. The step
planner's long lone steps (``drivers/llamacpp/step_planner.py``, ``LONG_STEPS``) are
what this measures: a prompt that misses its TTFT target in short steps is read in
longer ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_mixed_traffic import WORDS, play, wait_ready, workload  # noqa: E402
from tests.bench.compare_interleaved import Target, one  # noqa: E402
from tests.bench.compare_servers import (  # noqa: E402
    build_llama_server,
    free_port,
    fresh_model_copy,
    start_comparison_daemon,
    start_llama_server_np8,
    stop_process,
)


def document(words: int, seed: int) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Document {seed} ({rng.getrandbits(32):08x}). Summarise: {body}"


def count_tokens(port: int, text: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/tokenize",
        data=json.dumps({"content": text}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return len(json.load(response)["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, nargs="+", default=[300, 600, 1000, 1800])
    parser.add_argument("--llama-server", type=Path)
    args = parser.parse_args()
    binary = args.llama_server or build_llama_server()
    ttft: dict[tuple[int, str], list[float]] = {}
    tokens: dict[int, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(fresh_model_copy(Path(tmp)))
        port = free_port()
        server = daemon = None
        try:
            server = start_llama_server_np8(binary, model, port)
            daemon = start_comparison_daemon(Path(tmp))
            targets = [
                Target("appliance", port=daemon.port, model="default", key=daemon.create_key("bench")),
                Target("llama-server", port=port),
            ]
            for t in targets:  # loads the model on demand, warms up (and teaches the planner its step cost)
                wait_ready(t)
                asyncio.run(play(t, workload(99, 4, 10.0)))
            for r in range(args.rounds):
                for words in args.words:
                    prompt = document(words, 1000 * r + words)
                    tokens.setdefault(words, []).append(count_tokens(port, prompt))
                    for t in targets if r % 2 == 0 else targets[::-1]:
                        time.sleep(1.0)
                        _, first, _ = asyncio.run(one(t, prompt, 4))
                        ttft.setdefault((words, t.name), []).append(first)
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            if daemon is not None:
                daemon.stop()
            if server is not None:
                stop_process(server)

    names = [t.name for t in targets]
    print(f"\nmedians of {args.rounds} rounds, one document at a time, 4 new tokens\n")
    print("| words | prompt tokens | " + " | ".join(f"{n} TTFT | {n} tokens/s" for n in names) + " | ratio |")
    print("|---|---|" + "---|---|" * len(names) + "---|")
    for words in args.words:
        n_tokens = round(statistics.median(tokens[words]))
        cells, medians = [], []
        for name in names:
            m = statistics.median(ttft[(words, name)])
            medians.append(m)
            cells.append(f"{m:.2f} s | {n_tokens / m:.0f}")
        print(f"| {words:,} | {n_tokens:,} | " + " | ".join(cells) + f" | {medians[0] / medians[1]:.2f}x |")


if __name__ == "__main__":
    main()
