"""Cost of metering per request: admit alone, admit + settle one at a time, and under concurrency.

    python tests/bench/bench_metering.py [--requests 5000] [--concurrency 64]

Runs against a real SQLite file in a temp dir (WAL, synchronous=NORMAL), with
quotas off (a key without limits), typical (key: requests/minute and tokens/day,
team: cost/month: 3 counters) and all (every dimension on the key and on its
team: 12 counters per request). Prints µs per request and requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from appliance.metering.meter import Meter  # noqa: E402
from tests.meterkit import add_key, add_team, new_db, set_price, set_quota, settings  # noqa: E402

BIG = 10**12
SETTLE = dict(
    model="m",
    variant=None,
    backend="llamacpp",
    prompt_tokens=30,
    completion_tokens=70,
    cached_tokens=0,
    ttft_ms=10.0,
    latency_ms=100.0,
    status=200,
)


async def run(meter: Meter, principal, n: int, concurrency: int, tag: str) -> dict[str, float]:
    # admit alone (released at once so counters do not grow without bound)
    t = time.perf_counter()
    admissions = [
        meter.admit_now(principal, request_id=f"{tag}a{i}", endpoint="chat", model="m", estimated_tokens=100) for i in range(n)
    ]
    admit_us = (time.perf_counter() - t) / n * 1e6
    await asyncio.gather(*(meter.release(a, status=499, model="m") for a in admissions))

    # admit + settle, one request at a time
    m = max(n // 5, 1)
    t = time.perf_counter()
    for i in range(m):
        await meter.settle(
            await meter.admit(principal, request_id=f"{tag}s{i}", endpoint="chat", model="m", estimated_tokens=100), **SETTLE
        )
    serial_us = (time.perf_counter() - t) / m * 1e6

    # admit + settle with `concurrency` requests in flight
    counter = iter(range(n))
    commits = meter.writer_stats.transactions

    async def worker() -> None:
        for i in counter:
            admission = await meter.admit(principal, request_id=f"{tag}c{i}", endpoint="chat", model="m", estimated_tokens=100)
            await meter.settle(admission, **SETTLE)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t
    return {
        "admit_us": admit_us,
        "serial_us": serial_us,
        "concurrent_us": elapsed / n * 1e6,
        "rps": n / elapsed,
        "per_commit": n / max(meter.writer_stats.transactions - commits, 1),
    }


async def main(n: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = new_db(Path(tmp) / "bench.db")
        team = add_team(db, "t")
        team2 = add_team(db, "t2")
        off, typical, every = add_key(db, "off"), add_key(db, "typical", team2), add_key(db, "all", team)
        set_quota(db, "key", typical.id, requests_per_minute=BIG, tokens_per_day=BIG)
        set_quota(db, "team", team2, cost_per_month=1e9)
        limits = dict(
            requests_per_minute=BIG,
            tokens_per_minute=BIG,
            tokens_per_day=BIG,
            tokens_per_month=BIG,
            cost_per_month=1e9,
            max_concurrent=BIG,
        )
        set_quota(db, "key", every.id, **limits)
        set_quota(db, "team", team, **limits)
        set_price(db, "*", 1.0, 2.0, 0.5)
        meter = Meter(settings(Path(tmp)), db)
        await meter.start()
        print(f"{n} requests, {concurrency} in flight; SQLite file, WAL, synchronous=NORMAL")
        print(
            f"{'quotas':<8}{'admit µs':>10}{'admit+settle serial µs':>24}{'admit+settle concurrent µs':>28}"
            f"{'req/s':>10}{'rows/commit':>13}"
        )
        for name, principal in (("off", off), ("typical", typical), ("all", every)):
            r = await run(meter, principal, n, concurrency, name)
            print(
                f"{name:<8}{r['admit_us']:>10.1f}{r['serial_us']:>24.1f}{r['concurrent_us']:>28.1f}{r['rps']:>10.0f}{r['per_commit']:>13.1f}"
            )
        await meter.stop()
        meter.close()
        db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.concurrency))
