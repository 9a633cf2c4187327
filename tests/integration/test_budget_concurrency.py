"""Budgets under concurrency, group commit, and a kill -9 during settles (reliability-table rows 12 and 13)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from appliance.errors import RateLimited
from appliance.metering.meter import Meter
from tests.meterkit import add_key, add_team, admit_in_threads, new_db, rows, set_price, set_quota, settings

ROOT = Path(__file__).resolve().parents[2]


def ledger_matches_counters(db) -> None:
    """Every counter's spent equals the sum of the ledger rows it covers; nothing is left reserved."""
    for subject, sid, dim, spent, reserved in rows(
        db, "SELECT subject_type, subject_id, dimension, spent, reserved FROM quota_counters"
    ):
        column = "key_id" if subject == "key" else "team_id"
        measure = {"requests_per_minute": "count(*)", "cost_per_month": "coalesce(sum(cost), 0)"}.get(
            dim, "coalesce(sum(prompt_tokens + completion_tokens), 0)"
        )
        ((total,),) = rows(db, f"SELECT {measure} FROM usage WHERE {column} = ?", sid)
        if dim == "max_concurrent":
            assert (spent, reserved) == (0, 0)
        else:
            assert (dim, spent, reserved) == (dim, pytest.approx(total), 0)


@pytest.fixture
def budget(tmp_path):
    """A key in a team; the key may spend 1000 tokens a day, the team 10 requests a minute: room for exactly 10."""
    db = new_db(tmp_path / "a.db")
    team = add_team(db, "t")
    key = add_key(db, "k", team)
    set_quota(db, "key", key.id, tokens_per_day=1000, max_concurrent=64)
    set_quota(db, "team", team, requests_per_minute=10, cost_per_month=1.0)
    set_price(db, "*", input_per_m=1.0, output_per_m=2.0)
    yield db, key
    db.dispose()


def test_64_threads_with_their_own_connections_admit_exactly_10(budget):
    db, key = budget
    results: queue.Queue[int] = queue.Queue()
    admit_in_threads(db.url.database, key, 64, "t", threading.Barrier(64), results)
    assert results.get() == 10
    assert rows(db, "SELECT count(*), sum(prompt_tokens + completion_tokens) FROM usage") == [(10, 1000)]
    ledger_matches_counters(db)


def test_64_processes_and_threads_admit_exactly_10(budget):
    db, key = budget
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(64), ctx.Queue()
    procs = [ctx.Process(target=admit_in_threads, args=(db.url.database, key, 16, f"p{i}", barrier, results)) for i in range(4)]
    for p in procs:
        p.start()
    admitted = sum(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert admitted == 10
    assert rows(db, "SELECT count(*) FROM usage") == [(10,)]
    ledger_matches_counters(db)


async def test_64_concurrent_tasks_on_one_meter_admit_exactly_10(tmp_path, budget):
    db, key = budget
    meter = Meter(settings(tmp_path), db)
    await meter.start()

    async def request(i: int) -> bool:
        await asyncio.sleep(0)
        try:
            admission = await meter.admit(key, request_id=f"a{i}", endpoint="chat", model="m", estimated_tokens=100)
        except RateLimited:
            return False
        await asyncio.sleep(0.01)  # all 64 are in flight before any settles
        await meter.settle(
            admission,
            model="m",
            variant=None,
            backend="x",
            prompt_tokens=50,
            completion_tokens=50,
            cached_tokens=0,
            ttft_ms=1.0,
            latency_ms=2.0,
            status=200,
        )
        return True

    assert sum(await asyncio.gather(*(request(i) for i in range(64)))) == 10
    await meter.stop()
    meter.close()
    ledger_matches_counters(db)


async def test_group_commit_many_settles_few_transactions_none_lost(tmp_path):
    db = new_db(tmp_path / "a.db")
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_day=10**9, requests_per_minute=10**6)
    meter = Meter(settings(tmp_path), db)
    await meter.start()
    n = 400
    admissions = [meter.admit_now(key, request_id=f"g{i}", endpoint="chat", model="m", estimated_tokens=10) for i in range(n)]
    base = meter.writer_stats.transactions
    await asyncio.gather(
        *(
            meter.settle(
                a,
                model="m",
                variant=None,
                backend="x",
                prompt_tokens=3,
                completion_tokens=4,
                cached_tokens=0,
                ttft_ms=1.0,
                latency_ms=2.0,
                status=200,
            )
            for a in admissions
        )
    )
    transactions = meter.writer_stats.transactions - base
    print(f"{n} settles in {transactions} transactions, largest batch {meter.writer_stats.largest_batch}")
    assert transactions <= n // 10
    assert meter.writer_stats.largest_batch >= 10
    await meter.stop()
    meter.close()
    assert rows(db, "SELECT count(*), count(DISTINCT request_id), sum(prompt_tokens + completion_tokens) FROM usage") == [
        (n, n, 7 * n)
    ]
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    ledger_matches_counters(db)


def test_kill_9_loses_no_acknowledged_settle(tmp_path):
    db = new_db(tmp_path / "a.db")
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_month=10**12, max_concurrent=1000)
    db.dispose()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"from tests.meterkit import hammer; hammer({str(db.url.database)!r}, {key.id})"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    acknowledged: list[str] = []
    deadline = time.monotonic() + 60
    while len(acknowledged) < 1500 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"hammer exited early: {proc.stderr.read()[-2000:]}")
        acknowledged.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    acknowledged += rest.split()  # lines written before the kill
    assert proc.returncode == -signal.SIGKILL

    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    recorded = {rid for (rid,) in rows(db, "SELECT request_id FROM usage")}
    missing = set(acknowledged) - recorded
    assert not missing, f"{len(missing)} acknowledged settles lost"
    assert len(recorded) >= len(acknowledged)

    # The restart releases what the dead process held; the ledger then equals the counters.
    async def restart() -> None:
        meter = Meter(settings(tmp_path), db)
        await meter.start()
        await meter.stop()
        meter.close()

    asyncio.run(restart())
    ledger_matches_counters(db)
