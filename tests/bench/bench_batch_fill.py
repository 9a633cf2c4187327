"""Interactive latency beside a running batch: TTFT and TPOT p95 alone and beside it, and what the batch gets done.

Starts a real daemon on the default model (``--parallel`` slots) and runs ``--interactive-streams`` streaming clients,
each sending ``--probes`` chats of ``--probe-tokens`` one after another, in two conditions:

* alone;
* while a batch of ``--lines`` chat lines (``--line-tokens`` each) runs through /v1/batches.

Prints, per condition, the interactive TTFT and TPOT p95 (and their ratio beside the batch to alone), the batch's
lines/s and completion tokens/s while the probes ran, and the engine's busy share over the same window: the share of
wall time its decode thread spent in steps (the worker's ``step_ms_total`` from its ``/stats``).

A p95 of a few dozen chats is close to their slowest, so ``--pairs N`` measures both conditions N times on the same
daemon, alternating which goes first (alone then beside, beside then alone, ...), and pools each condition's chats:
the pooled rows are the result, the per-pair rows show the spread.

    .venv/bin/python -m tests.bench.bench_batch_fill [--lines 500] [--probes 8] [--interactive-streams 4] [--pairs 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from tests.daemon import RunningDaemon, start_daemon

MODEL = "default"


@dataclass
class Window:
    """What one condition measured."""

    ttft: list[float]
    tpot: list[float]
    busy_share: float
    batch_lines_s: float = 0.0
    batch_tokens_s: float = 0.0


def _chat(content: str, tokens: int, **extra: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0.7,
        **extra,
    }


def _stream(client: httpx.Client, body: dict) -> tuple[float, float | None, int]:
    """One streamed chat: (TTFT, TPOT or None when fewer than two tokens came, completion tokens)."""
    began = time.perf_counter()
    first = last = 0.0
    chunks = 0
    usage_tokens = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage_tokens = event["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    tokens = usage_tokens or chunks
    if not first:
        return time.perf_counter() - began, None, tokens
    tpot = (last - first) / (tokens - 1) if tokens > 1 and last > first else None
    return first - began, tpot, tokens


def _interactive(daemon: RunningDaemon, key: str, args: argparse.Namespace) -> tuple[list[float], list[float], int]:
    """``--interactive-streams`` clients, each streaming ``--probes`` chats one after another."""
    ttft: list[float] = []
    tpot: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def stream_client(n: int) -> None:
        try:
            with daemon.client(key) as client:
                for i in range(args.probes):
                    body = _chat(
                        f"Probe {n}.{i}: describe the sea in a few sentences.",
                        args.probe_tokens,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    first, per_token, count = _stream(client, body)
                    with lock:
                        ttft.append(first)
                        tokens[0] += count
                        if per_token is not None:
                            tpot.append(per_token)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=stream_client, args=(n,)) for n in range(args.interactive_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return ttft, tpot, tokens[0]


def _engine_stats(daemon: RunningDaemon) -> dict[str, float]:
    """The llama.cpp worker's /stats (the one engine the daemon runs here)."""
    sockets = [p for p in daemon.data_dir.rglob("*.sock") if p.name != "admin.sock"]
    if len(sockets) != 1:
        raise SystemExit(f"expected one engine socket, found {sockets}")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sockets[0])), base_url="http://engine", timeout=30) as c:
        response = c.get("/stats")
        response.raise_for_status()
        return response.json()


def _measured(daemon: RunningDaemon, key: str, args: argparse.Namespace) -> tuple[Window, float, float]:
    """Interactive streams timed, with the engine's step time and tokens over the same window."""
    before, began = _engine_stats(daemon), time.perf_counter()
    ttft, tpot, interactive_tokens = _interactive(daemon, key, args)
    after, elapsed = _engine_stats(daemon), time.perf_counter() - began
    busy = (after["step_ms_total"] - before["step_ms_total"]) / 1000 / elapsed
    other_tokens = after["tokens_generated_total"] - before["tokens_generated_total"] - interactive_tokens
    return Window(ttft, tpot, busy), other_tokens, elapsed


def _with_batch(daemon: RunningDaemon, key: str, args: argparse.Namespace) -> Window:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0, timeout=600)
    content = b"".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": _chat(f"Line {i}: tell a story.", args.line_tokens),
            }
        ).encode()
        + b"\n"
        for i in range(args.lines)
    )
    file_id = client.files.create(file=("lines.jsonl", io.BytesIO(content)), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 300
    while client.batches.retrieve(batch.id).request_counts.completed < 4:  # the batch is under way
        if time.monotonic() > deadline:
            raise SystemExit("the batch did not start within 5 minutes")
        time.sleep(0.1)
    done_before = client.batches.retrieve(batch.id).request_counts.completed
    window, batch_tokens, elapsed = _measured(daemon, key, args)
    done_after = client.batches.retrieve(batch.id).request_counts.completed
    if done_after >= args.lines:
        print(f"warning: the batch finished before the probes did ({args.lines} lines): use more --lines")
    client.batches.cancel(batch.id)
    while client.batches.retrieve(batch.id).status != "cancelled":
        time.sleep(0.2)
    window.batch_lines_s = (done_after - done_before) / elapsed
    window.batch_tokens_s = batch_tokens / elapsed
    return window


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)] if values else float("nan")


def _pooled(windows: list[Window]) -> Window:
    """One condition's chats from every pair together; shares and rates averaged."""
    return Window(
        ttft=[t for w in windows for t in w.ttft],
        tpot=[t for w in windows for t in w.tpot],
        busy_share=statistics.fmean(w.busy_share for w in windows),
        batch_lines_s=statistics.fmean(w.batch_lines_s for w in windows),
        batch_tokens_s=statistics.fmean(w.batch_tokens_s for w in windows),
    )


def _row(name: str, w: Window) -> str:
    return (
        f"| {name} | {len(w.ttft)} | {statistics.median(w.ttft):.2f} | {_p95(w.ttft):.2f}"
        f" | {statistics.median(w.tpot) * 1000:.0f} | {_p95(w.tpot) * 1000:.0f} | {w.batch_lines_s:.2f}"
        f" | {w.batch_tokens_s:.1f} | {w.busy_share:.0%} |"
    )


def _ratios(alone: Window, beside: Window) -> str:
    return f"TTFT p95 {_p95(beside.ttft) / _p95(alone.ttft):.2f}x, TPOT p95 {_p95(beside.tpot) / _p95(alone.tpot):.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=500)
    ap.add_argument("--line-tokens", type=int, default=48)
    ap.add_argument("--interactive-streams", type=int, default=4)
    ap.add_argument("--probes", type=int, default=8, help="streamed chats per interactive stream")
    ap.add_argument("--probe-tokens", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=8, help="engine slots (engine_parallel)")
    ap.add_argument("--pairs", type=int, default=1, help="times each condition is measured, alternating which goes first")
    args = ap.parse_args()
    alone: list[Window] = []
    beside: list[Window] = []
    with tempfile.TemporaryDirectory() as tmp:
        # batch_holdback_attainment off: on a box too slow for the interactive targets alone it would keep the batch
        # from starting at all, and this measures what the engine does with both running
        daemon = start_daemon(Path(tmp), APPLIANCE_ENGINE_PARALLEL=str(args.parallel), APPLIANCE_BATCH_HOLDBACK_ATTAINMENT="0")
        try:
            key = daemon.create_key("bench")
            with daemon.client(key) as client:  # load the model, warm its caches
                for i in range(3):
                    client.post("/v1/chat/completions", json=_chat(f"Warm {i}.", 8)).raise_for_status()
            for pair in range(args.pairs):
                for condition in ("alone", "beside") if pair % 2 == 0 else ("beside", "alone"):
                    if condition == "alone":
                        alone.append(_measured(daemon, key, args)[0])
                    else:
                        beside.append(_with_batch(daemon, key, args))
        except httpx.HTTPError as exc:
            raise SystemExit(f"request failed: {exc}\n{daemon.log()[-2000:]}") from None
        finally:
            daemon.stop()
    print(
        f"\n{args.interactive_streams} interactive streams x {args.probes} chats of {args.probe_tokens} tokens;"
        f" batch lines of {args.line_tokens} tokens; {args.parallel} slots; {args.pairs} pair(s);"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| condition | chats | TTFT median s | TTFT p95 s | TPOT median ms | TPOT p95 ms | batch lines/s | batch tok/s"
        " | engine busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    if args.pairs > 1:
        for i, (a, b) in enumerate(zip(alone, beside, strict=True), 1):
            print(_row(f"pair {i}: alone", a))
            print(_row(f"pair {i}: beside the batch ({_ratios(a, b)})", b))
    pooled_alone, pooled_beside = _pooled(alone), _pooled(beside)
    print(_row("alone", pooled_alone))
    print(_row(f"beside a {args.lines}-line batch", pooled_beside))
    print(f"beside the batch / alone: {_ratios(pooled_alone, pooled_beside)}")


if __name__ == "__main__":
    main()
