"""Measure the llama.cpp worker alone: aggregate tok/s and TTFT at 1 and 8 streams.

    python tests/bench/bench_worker.py [--threads 1 2] [--streams 1 8] [--tokens 128]

Starts the worker on the default model (Gemma 3 270M Q4_K_M) over a Unix
socket, then for each thread count and concurrency runs streaming
/v1/completions, greedy, end-of-generation banned so every request makes
exactly --tokens tokens, 16 different short prompts. Prints one line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fixtures_models import ensure_default_gguf  # noqa: E402

PROMPTS = [
    "The history of the printing press",
    "A recipe for bread begins with",
    "In the year 2050, cities",
    "The rules of chess are",
    "Photosynthesis is the process",
    "The best way to learn a language",
    "Once upon a time in a small village",
    "The theory of relativity says",
    "To build a wooden table you",
    "The ocean covers most of",
    "Computers store information as",
    "A good night's sleep helps",
    "The Roman Empire was",
    "Volcanoes form when",
    "The stock market is",
    "Music has always been",
]
EOG = {"1": -100, "106": -100}  # Gemma 3: <eos>, <end_of_turn>


async def one(client: httpx.AsyncClient, prompt: str, tokens: int) -> tuple[float, int, float]:
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": EOG,
    }
    t0 = time.perf_counter()
    ttft = None
    n = 0
    async with client.stream("POST", "http://worker/v1/completions", json=body) as r:
        r.raise_for_status()
        async for obj in sse_events(r):
            if obj.get("choices") and obj["choices"][0].get("text") and ttft is None:
                ttft = time.perf_counter() - t0
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
    return ttft or 0.0, n, time.perf_counter() - t0


async def sse_events(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON events of a streamed OpenAI-style response, without the closing ``[DONE]``."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def run(sock: str, streams: int, tokens: int, rounds: int) -> dict:
    transport = httpx.AsyncHTTPTransport(uds=sock)
    async with httpx.AsyncClient(transport=transport, timeout=600) as client:
        await one(client, "warm up", 8)
        before = (await client.get("http://worker/stats")).json()
        ttfts: list[float] = []
        total = 0
        t0 = time.perf_counter()
        for r in range(rounds):
            res = await asyncio.gather(*(one(client, PROMPTS[(r * streams + i) % len(PROMPTS)], tokens) for i in range(streams)))
            ttfts += [x[0] for x in res]
            total += sum(x[1] for x in res)
        wall = time.perf_counter() - t0
        stats = (await client.get("http://worker/stats")).json()
    ttfts.sort()
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]
    return {
        "streams": streams,
        "tokens": total,
        "wall_s": round(wall, 2),
        "agg_tok_s": round(total / wall, 1),
        "per_stream_tok_s": round(total / wall / streams, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 3),
        "ttft_p95_s": round(p95, 3),
        "spec_accepted/drafted": f"{stats['spec_accepted_total']}/{stats['spec_drafted_total']}",
        # share of the decode thread's busy time spent inside llama_decode (1.0 = no Python overhead)
        "decode_share": round(
            (stats["decode_ms_total"] - before["decode_ms_total"]) / max(1, stats["step_ms_total"] - before["step_ms_total"]), 3
        ),
        "busy_share_of_wall": round((stats["step_ms_total"] - before["step_ms_total"]) / 1000 / wall, 3),
    }


def start_worker(model: Path, sock: str, threads: int, parallel: int, extra: list[str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "appliance.drivers.llamacpp.worker",
        "--model",
        str(model),
        "--socket",
        sock,
        "--served-name",
        "default",
        "--ctx",
        "1024",
        "--parallel",
        str(parallel),
        "--threads",
        str(threads),
        "--n-gpu-layers",
        "0",
        *extra,
    ]
    proc = subprocess.Popen(cmd)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=1) as c:
                ok = c.get("http://worker/health").status_code == 200
            if ok:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit("worker exited at start")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("worker did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--worker-arg", action="append", default=[], help="extra worker argument (repeatable)")
    args = ap.parse_args()
    model = ensure_default_gguf()
    with tempfile.TemporaryDirectory() as d:
        for threads in args.threads:
            sock = os.path.join(d, f"w{threads}.sock")
            proc = start_worker(model, sock, threads, args.parallel, args.worker_arg)
            try:
                for s in args.streams:
                    res = asyncio.run(run(sock, s, args.tokens, args.rounds))
                    print(json.dumps({"threads": threads, **res}), flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
