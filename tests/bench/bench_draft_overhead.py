"""What speculative decoding costs where it does not draft: workers with it on and off, two processes of each.

    python -m tests.bench.bench_draft_overhead [--rounds 4] [--streams 8 3 1]

Drafting runs only while at most two streams generate (``drivers/llamacpp/speculation.py``),
so at 3 and 8 streams started together a drafting worker decodes the same steps as a
plain one. Two processes with identical settings on this box have differed by ~10% in
decode speed, so one process of each kind cannot tell a cost of a few percent from the
luck of a process: this starts four llama.cpp workers on one fresh copy of the default
model (drafting on, off, off, on, in that order; 2 threads, 8 slots of 2,048 tokens, as
``compare_interleaved.py`` starts the worker alone) and measures every load on all four
in each round, the order rotating by round. Streaming ``/v1/completions``, greedy, 128
tokens with ``ignore_eos``, the prompts of ``compare_interleaved.py``. Prints each
worker's median aggregate tokens/s per load, the medians per kind over both processes
and all rounds, their ratio, and how many tokens the drafting workers drafted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from appliance.drivers.llamacpp.driver import SPEC_NGRAM  # noqa: E402
from tests.bench.compare_interleaved import Refused, Target, measure, start_worker  # noqa: E402
from tests.bench.compare_servers import fresh_model_copy  # noqa: E402

KINDS = ("drafting", "plain", "plain", "drafting")


def drafted(sock: str) -> int:
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://worker", timeout=30) as c:
        return int(c.get("/stats").json()["spec_drafted_total"])


def warm_up(target: Target) -> None:
    """Two streams once the model is loaded (the worker answers 503 until then)."""
    while True:
        try:
            asyncio.run(measure(target, 2))
            return
        except Refused:
            time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--streams", type=int, nargs="+", default=[8, 3, 1])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(fresh_model_copy(Path(tmp)))
        socks = [os.path.join(tmp, f"{i}.sock") for i in range(len(KINDS))]
        procs = [
            start_worker(model, sock, *(["--spec-ngram", str(SPEC_NGRAM)] if kind == "drafting" else []))
            for kind, sock in zip(KINDS, socks, strict=True)
        ]
        try:
            while not all(os.path.exists(s) for s in socks):
                time.sleep(0.2)
            targets = [Target(f"{kind} {i + 1}", socket=s) for i, (kind, s) in enumerate(zip(KINDS, socks, strict=True))]
            for t in targets:
                warm_up(t)
            runs: dict[str, dict[int, list[float]]] = {t.name: {n: [] for n in args.streams} for t in targets}
            spent = {n: 0 for n in args.streams}  # tokens the drafting workers drafted, per load
            for r in range(args.rounds):
                order = targets[r % len(targets) :] + targets[: r % len(targets)]
                for n in args.streams:
                    for t in order:
                        start = drafted(t.socket) if t.name.startswith("drafting") else 0
                        runs[t.name][n].append(asyncio.run(measure(t, n))["aggregate"])
                        if t.name.startswith("drafting"):
                            spent[n] += drafted(t.socket) - start
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait()

    print(f"\n{args.rounds} rounds, aggregate tokens/s (medians); 128 greedy tokens per stream, 2 threads\n")
    print("| worker | " + " | ".join(f"{n} stream{'s' if n > 1 else ''}" for n in args.streams) + " |")
    print("|---|" + "---|" * len(args.streams))
    for t in targets:
        print(f"| {t.name} | " + " | ".join(f"{statistics.median(runs[t.name][n]):.1f}" for n in args.streams) + " |")
    pooled = {
        kind: {n: statistics.median(x for t in targets if t.name.startswith(kind) for x in runs[t.name][n]) for n in args.streams}
        for kind in ("drafting", "plain")
    }
    for kind in ("drafting", "plain"):
        print(f"| **{kind}, both** | " + " | ".join(f"{pooled[kind][n]:.1f}" for n in args.streams) + " |")
    ratios = ", ".join(f"{n} streams {pooled['drafting'][n] / pooled['plain'][n]:.2f}x" for n in args.streams)
    print(f"\ndrafting / plain: {ratios}")
    print("tokens the drafting workers drafted, all rounds: " + ", ".join(f"{n} streams {spent[n]}" for n in args.streams))


if __name__ == "__main__":
    main()
