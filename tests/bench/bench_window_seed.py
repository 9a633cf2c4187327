"""What counting a window from the ledger costs: the admission that makes a counter, against one that finds it.

A counter made mid-window takes its ``spent`` from the usage ledger (a sum over the
key's rows of the window, on the ``(key_id, created_at)`` index), once per window
per counter. This script fills a real migrated SQLite file with ``--rows`` ledger
rows of one key in the current month, puts a ``tokens_per_month`` limit on it, and
times, on the real meter:

- ``set_quota`` through the quota service, the way the CLI, API and console set a
  limit (it reads the window's ledger, then writes the running window's counter),
  while another key's requests are admitted and settled one after another, 5 ms
  apart (their slowest shows how long the write lock was held), then the first admission after
  it (the counter exists);
- a limit written directly ("a row": a restore, another tool): the first
  admission of the window makes the counter, so the ledger sum runs in the
  group-commit writer's transaction;
- the admissions after it (one conditional UPDATE per counter),

each admission settled before the next, medians of ``--repeat`` fresh databases.

    python tests/bench/bench_window_seed.py [--rows 10000 100000 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from appliance.metering.admin import QuotaService  # noqa: E402
from appliance.metering.meter import Meter  # noqa: E402
from appliance.metering.quotas import month_bounds  # noqa: E402
from tests.meterkit import add_key, new_db, set_quota, settings  # noqa: E402

LATER = 50


def fill(db_path: Path, key_id: int, rows: int, now: float) -> None:
    """``rows`` ledger rows of ``key_id`` spread over the month so far."""
    span = max(1, int(now - month_bounds(now)[0]) - 1)
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany(
            "INSERT INTO usage (request_id, created_at, key_id, endpoint, model, prompt_tokens, completion_tokens,"
            " cached_tokens, latency_ms, status, cache_tier, cost) VALUES (?, ?, ?, 'chat', 'm', 10, 20, 0, 1.0, 200, 'miss', 0)",
            ((f"seed{i}", now - 1 - (i % span), key_id) for i in range(rows)),
        )
    conn.close()


async def admit_and_settle(meter: Meter, key, rid: str) -> float:
    """One admission's milliseconds (its settle not counted)."""
    started = time.perf_counter()
    admission = await meter.admit(key, request_id=rid, endpoint="chat", model="m", estimated_tokens=30, cap=True, max_tokens=20)
    took = (time.perf_counter() - started) * 1000
    await meter.settle(
        admission,
        model="m",
        variant=None,
        backend="x",
        prompt_tokens=10,
        completion_tokens=20,
        cached_tokens=0,
        ttft_ms=1.0,
        latency_ms=1.0,
        status=200,
    )
    return took


async def one_run(rows: int, through_service: bool) -> tuple[float, float, float, float, float]:
    """(set_quota ms, another key's slowest request while it ran, first admission ms, later median ms, later max ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        db = new_db(path)
        key = add_key(db, "bench")
        other = add_key(db, "other")
        set_quota(db, "key", other.id, tokens_per_day=10**12)
        fill(path, key.id, rows, time.time())
        meter = Meter(settings(Path(tmp)), db)
        await meter.start()
        try:
            set_ms, stall_ms = 0.0, 0.0
            if through_service:
                service = QuotaService(db, meter)
                change = asyncio.create_task(
                    asyncio.to_thread(service.set_quota, f"key:{key.id}", {"tokens_per_month": 10**12}, "bench")
                )
                started = time.perf_counter()
                n = 0
                while not change.done():  # another key's requests, admitted and settled one after another
                    one = time.perf_counter()
                    await admit_and_settle(meter, other, f"o{n}")
                    stall_ms = max(stall_ms, (time.perf_counter() - one) * 1000)
                    n += 1
                    await asyncio.sleep(0.005)  # a busy box, not a saturated writer: room for the admin's transaction
                await change
                set_ms = (time.perf_counter() - started) * 1000
            else:
                set_quota(db, "key", key.id, tokens_per_month=10**12)
            times = [await admit_and_settle(meter, key, f"b{i}") for i in range(1 + LATER)]
            conn = sqlite3.connect(path)
            spent = conn.execute("SELECT spent FROM quota_counters WHERE subject_id = ?", (key.id,)).fetchone()[0]
            conn.close()
            assert spent == (rows + 1 + LATER) * 30, spent
        finally:
            await meter.stop()
            meter.close()
            db.dispose()
    return set_ms, stall_ms, times[0], statistics.median(times[1:]), max(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        "| key's ledger rows this month | limit set by | set_quota ms | another key's slowest request meanwhile ms"
        " | first admission ms | later p50 ms | later max ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        for through_service in (True, False):
            runs = [asyncio.run(one_run(rows, through_service)) for _ in range(args.repeat)]
            f = [statistics.median(r[i] for r in runs) for i in range(5)]
            how, setting, stall = ("the quota service", f"{f[0]:.1f}", f"{f[1]:.1f}") if through_service else ("a row", "–", "–")
            print(f"| {rows:,} | {how} | {setting} | {stall} | {f[2]:.2f} | {f[3]:.3f} | {f[4]:.3f} |")


if __name__ == "__main__":
    main()
