"""The llama.cpp worker with and without even output rows, in interleaved rounds.

    python tests/bench/bench_even_outputs.py [--rounds 4]

Starts four workers on one fresh copy of the default model (2 threads, 8 slots of
2,048 tokens), one after another: two with ``--even-outputs off``, two with the
default ``auto`` (which measures at load whether this box decodes an even number of
logits rows faster, see ``drivers/llamacpp/output_parity.py``). Two processes of
each kind, because two processes of the same build can differ by several percent
for as long as they live. Each round runs every load on all four, in turn (the
order rotates): 3, 5, 7 and 8 concurrent streams of 128 greedy tokens (``ignore_eos``),
and a staggered load of 8 streams asking for 16 to 128 tokens, so the number of
generating sequences falls from 8 to 1 as they finish. Prints each load's median
aggregate tokens per second per kind and the ratio, then each ``auto`` worker's
calibration and how many of its decode steps were padded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_page_cache import ready  # noqa: E402
from tests.bench.compare_interleaved import MAX_TOKENS, PROMPTS, Target, one, start_worker  # noqa: E402
from tests.bench.compare_servers import fresh_model_copy  # noqa: E402

#: (label, max_tokens of each concurrent request)
LOADS = [
    ("3 streams", [MAX_TOKENS] * 3),
    ("5 streams", [MAX_TOKENS] * 5),
    ("7 streams", [MAX_TOKENS] * 7),
    ("8 streams", [MAX_TOKENS] * 8),
    ("8 staggered", [16 * (i + 1) for i in range(8)]),
]


async def aggregate(target: Target, lengths: list[int]) -> float:
    started = time.perf_counter()
    results = await asyncio.gather(*(one(target, PROMPTS[i % len(PROMPTS)], n) for i, n in enumerate(lengths)))
    return sum(events for events, _, _ in results) / (time.perf_counter() - started)


def stats(socket: str) -> dict[str, int]:
    """The worker's ``/stats`` over its Unix socket."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), timeout=10) as client:
        return client.get("http://worker/stats").json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = fresh_model_copy(Path(tmp))
        targets, procs = [], []
        try:
            for i, mode in enumerate(("off", "auto") * 2):  # one at a time: a calibration under load is noise
                sock = os.path.join(tmp, f"{i}.sock")
                procs.append(
                    start_worker(model, sock, "--even-outputs", mode, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
                targets.append(Target(mode, socket=sock))
                asyncio.run(ready(targets[-1], time.monotonic() + 120))
            rates: dict[tuple[str, str], list[float]] = {(label, mode): [] for label, _ in LOADS for mode in ("off", "auto")}
            for r in range(args.rounds):
                for label, lengths in LOADS:
                    for t in targets[r % 4 :] + targets[: r % 4]:
                        rates[(label, t.name)].append(asyncio.run(aggregate(t, lengths)))
            calibrations = [stats(t.socket) for t in targets if t.name == "auto"]
        finally:
            for p in procs:
                p.terminate()
                p.wait()
    print(f"{'load':14s} {'off tok/s':>10s} {'auto tok/s':>11s} {'auto/off':>9s}")
    for label, _ in LOADS:
        off, auto = (statistics.median(rates[(label, name)]) for name in ("off", "auto"))
        print(f"{label:14s} {off:10.1f} {auto:11.1f} {auto / off:8.2f}x")
    for c in calibrations:
        print(
            f"auto: even_outputs={c['even_outputs']} (7 rows {c['even_outputs_odd_rows_us'] / 1000:.1f} ms, "
            f"8 rows {c['even_outputs_even_rows_us'] / 1000:.1f} ms at load); "
            f"{c['even_outputs_padded_steps_total']} steps padded"
        )


if __name__ == "__main__":
    main()
