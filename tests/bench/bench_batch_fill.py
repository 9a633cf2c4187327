"""Interactive latency beside a batch, against the same work fired at the interactive API.

Starts a real daemon on the default model (4 slots) and times a light interactive chat (``--probes`` of them, one
after another, ``--probe-tokens`` each) in three conditions:

* alone;
* while a batch of ``--lines`` chat lines (``--line-tokens`` each) runs through /v1/batches;
* while the same lines are sent to /v1/chat/completions by 4 concurrent client workers (how work that can wait
  gets in without a Batch API).

Prints the probes' median and p95 latency, and how many background lines finished per second meanwhile.

    .venv/bin/python -m tests.bench.bench_batch_fill [--lines 120] [--probes 20]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from tests.daemon import RunningDaemon, start_daemon

MODEL = "default"


def _chat(content: str, tokens: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": tokens, "temperature": 0.7}


def _probes(daemon: RunningDaemon, key: str, n: int, tokens: int) -> list[float]:
    times = []
    with daemon.client(key) as client:
        for i in range(n):
            began = time.perf_counter()
            client.post("/v1/chat/completions", json=_chat(f"Probe {i}: name a colour.", tokens)).raise_for_status()
            times.append(time.perf_counter() - began)
    return times


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def _with_batch(daemon: RunningDaemon, key: str, args: argparse.Namespace) -> tuple[list[float], float]:
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
    while client.batches.retrieve(batch.id).request_counts.completed < 4:  # the batch is under way
        time.sleep(0.1)
    done_before = client.batches.retrieve(batch.id).request_counts.completed
    began = time.perf_counter()
    times = _probes(daemon, key, args.probes, args.probe_tokens)
    elapsed = time.perf_counter() - began
    done_after = client.batches.retrieve(batch.id).request_counts.completed
    client.batches.cancel(batch.id)
    while client.batches.retrieve(batch.id).status != "cancelled":
        time.sleep(0.2)
    return times, (done_after - done_before) / elapsed


def _with_interactive_flood(daemon: RunningDaemon, key: str, args: argparse.Namespace) -> tuple[list[float], float]:
    stop = threading.Event()
    finished = [0]
    lock = threading.Lock()

    def worker(offset: int) -> None:
        with daemon.client(key) as client:
            i = offset
            while not stop.is_set() and i < args.lines:
                client.post("/v1/chat/completions", json=_chat(f"Line {i}: tell a story.", args.line_tokens))
                with lock:
                    finished[0] += 1
                i += 4

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    time.sleep(2.0)
    before = finished[0]
    began = time.perf_counter()
    times = _probes(daemon, key, args.probes, args.probe_tokens)
    rate = (finished[0] - before) / (time.perf_counter() - began)
    stop.set()
    for w in workers:
        w.join()
    return times, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=120)
    ap.add_argument("--line-tokens", type=int, default=48)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--probe-tokens", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp), APPLIANCE_ENGINE_PARALLEL="4")
        try:
            key = daemon.create_key("bench")
            _probes(daemon, key, 3, args.probe_tokens)  # load the model, warm its caches
            rows = [("alone", _probes(daemon, key, args.probes, args.probe_tokens), 0.0)]
            rows.append(("beside a batch (/v1/batches)", *_with_batch(daemon, key, args)))
            rows.append(("beside the same lines sent interactively, 4 workers", *_with_interactive_flood(daemon, key, args)))
        except httpx.HTTPError as exc:
            raise SystemExit(f"request failed: {exc}\n{daemon.log()[-2000:]}") from None
        finally:
            daemon.stop()
    print(
        f"\nlight chat ({args.probe_tokens} tokens), {args.probes} one after another;"
        f" background lines of {args.line_tokens} tokens"
    )
    print("| condition | probe median s | probe p95 s | background lines/s |")
    print("|---|---|---|---|")
    for name, times, rate in rows:
        print(f"| {name} | {statistics.median(times):.2f} | {_p95(times):.2f} | {rate:.2f} |")


if __name__ == "__main__":
    main()
