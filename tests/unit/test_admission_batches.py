"""Admissions made in the group-commit writer's batches: shared transactions, refusals, duplicates, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from appliance.errors import Conflict, QuotaExceeded, RateLimited
from tests.meterkit import add_key, add_team, rows, set_quota

SETTLE = dict(variant=None, backend="llamacpp", cached_tokens=0, ttft_ms=5.0, latency_ms=20.0, status=200)


async def test_concurrent_admissions_share_transactions_and_hold_what_they_reserved(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=1000, tokens_per_day=10**6, max_concurrent=100)
    before = meter.writer_stats.transactions
    admissions = await asyncio.gather(
        *(meter.admit(key, request_id=f"r{i}", endpoint="chat", model="m", estimated_tokens=7) for i in range(50))
    )
    assert meter.writer_stats.transactions - before < 50  # batched: fewer transactions than admissions
    assert rows(db, "SELECT count(*) FROM reservations") == [(50,)]
    held = dict(rows(db, "SELECT dimension, reserved FROM quota_counters"))
    assert held == {"requests_per_minute": 50, "tokens_per_day": 350, "max_concurrent": 50}
    assert all(len(a.holds) == 3 for a in admissions)
    assert admissions[-1].headers["x-ratelimit-remaining-requests"] == "950"
    await asyncio.gather(*(meter.settle(a, model="m", prompt_tokens=3, completion_tokens=4, **SETTLE) for a in admissions))
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    assert dict(rows(db, "SELECT dimension, reserved FROM quota_counters")) == {
        "requests_per_minute": 0,
        "tokens_per_day": 0,
        "max_concurrent": 0,
    }


async def test_a_refusal_in_a_batch_undoes_only_its_own_partial_reservation(meter, db):
    """The team's counter takes the request, the key's day budget refuses it: the team keeps no trace of it."""
    team = add_team(db, "t")
    big = add_key(db, "big", team)
    small = add_key(db, "small", team)
    set_quota(db, "team", team, tokens_per_day=10_000)
    set_quota(db, "key", small.id, tokens_per_day=100)
    results = await asyncio.gather(
        *(
            meter.admit(k, request_id=f"{k.name}{i}", endpoint="chat", model="m", estimated_tokens=tokens)
            for i in range(5)
            for k, tokens in ((big, 50), (small, 500))
        ),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    admitted = [r for r in results if not isinstance(r, BaseException)]
    assert len(refused) == 5 and len(admitted) == 5
    assert all(a.key_id == big.id for a in admitted)
    assert refused[0].headers["x-ratelimit-remaining-tokens"] == "100"  # the key's counter, as the refusal found it
    # the team holds the five admitted requests only; the refused key's counter was rolled back with its reservation
    assert rows(db, "SELECT subject_type, dimension, reserved FROM quota_counters") == [("team", "tokens_per_day", 250)]


async def test_a_request_id_already_in_flight_is_a_conflict(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10)
    first = await meter.admit(key, request_id="same", endpoint="chat", model="m", estimated_tokens=1)
    with pytest.raises(Conflict):
        await meter.admit(key, request_id="same", endpoint="chat", model="m", estimated_tokens=1)
    assert dict(rows(db, "SELECT dimension, reserved FROM quota_counters")) == {"requests_per_minute": 1}
    await meter.settle(first, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)


async def test_a_request_cancelled_while_its_reservation_is_queued_leaves_nothing_held(meter, db):
    """The client leaves while the admission waits for the writer: what was reserved is released as a 499."""
    key = add_key(db)
    other = add_key(db, "other")
    set_quota(db, "key", key.id, max_concurrent=1, tokens_per_day=1000)
    set_quota(db, "key", other.id, requests_per_minute=10)
    busy = await meter.admit(other, request_id="busy", endpoint="chat", model="m", estimated_tokens=1)  # not alone: queued
    task = asyncio.create_task(meter.admit(key, request_id="gone", endpoint="chat", model="m", estimated_tokens=400))
    await asyncio.sleep(0)  # submitted to the writer, not yet answered
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if rows(db, "SELECT count(*) FROM usage") == [(1,)]:
            break
        await asyncio.sleep(0.01)
    assert rows(db, "SELECT request_id, status FROM usage") == [("gone", 499)]
    assert rows(db, "SELECT request_id FROM reservations") == [("busy",)]
    assert dict(rows(db, "SELECT dimension, reserved FROM quota_counters WHERE subject_id = ?", key.id)) == {
        "max_concurrent": 0,
        "tokens_per_day": 0,
    }
    # the one concurrency slot is free again
    again = await meter.admit(key, request_id="next", endpoint="chat", model="m", estimated_tokens=10)
    with pytest.raises(RateLimited):
        await meter.admit(key, request_id="third", endpoint="chat", model="m", estimated_tokens=10)
    for admission in (again, busy):
        await meter.settle(admission, model="m", prompt_tokens=10, completion_tokens=0, **SETTLE)
    assert meter.in_flight == 0


def _watch_connection(meter, monkeypatch) -> list[int]:
    """The threads that run statements on the meter's connection from now on."""
    import threading

    seen: list[int] = []
    real = meter.database.conn

    class Watch:
        def __getattr__(self, name):
            return getattr(real, name)

        def execute(self, *args):
            seen.append(threading.get_ident())
            return real.execute(*args)

    monkeypatch.setattr(meter.database.writer, "_conn", Watch())
    return seen


async def test_with_other_requests_in_flight_admission_does_no_sqlite_work_on_the_event_loop(meter, db, monkeypatch):
    """Under load the reservation rides in the writer's batch: the event loop never runs a statement itself."""
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10)
    warm = await meter.admit(key, request_id="warm", endpoint="chat", model="m", estimated_tokens=1)  # stays in flight
    loop_thread = asyncio.get_running_loop()._thread_id  # type: ignore[attr-defined]
    seen = _watch_connection(meter, monkeypatch)
    admission = await meter.admit(key, request_id="watched", endpoint="chat", model="m", estimated_tokens=1)
    await meter.settle(admission, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)
    assert seen and loop_thread not in seen
    await meter.settle(warm, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)


async def test_a_request_alone_is_admitted_and_settled_without_a_thread_hand_off(meter, db, monkeypatch):
    """One request in flight: its reservation and its settlement are each one transaction written at once, on the loop."""
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10, tokens_per_day=1000)
    loop_thread = asyncio.get_running_loop()._thread_id  # type: ignore[attr-defined]
    seen = _watch_connection(meter, monkeypatch)
    before = meter.writer_stats.transactions
    admission = await meter.admit(key, request_id="alone", endpoint="chat", model="m", estimated_tokens=5)
    assert set(seen) == {loop_thread} and meter.in_flight == 1
    assert rows(db, "SELECT request_id FROM reservations") == [("alone",)]  # committed: another connection sees it
    await meter.settle(admission, model="m", prompt_tokens=5, completion_tokens=3, **SETTLE)
    assert set(seen) == {loop_thread} and meter.in_flight == 0
    assert meter.writer_stats.transactions - before == 2
    assert rows(db, "SELECT request_id, prompt_tokens, completion_tokens FROM usage") == [("alone", 5, 3)]
    assert dict(rows(db, "SELECT dimension, spent FROM quota_counters")) == {"requests_per_minute": 1, "tokens_per_day": 8}


async def test_a_request_alone_never_waits_on_the_event_loop_for_a_locked_database(meter, db):
    """Another connection holds the write lock: the loop is not blocked, the writer thread waits for the lock instead."""
    import sqlite3
    import time

    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10)
    holder = sqlite3.connect(db.url.database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.perf_counter()
        task = asyncio.create_task(meter.admit(key, request_id="blocked", endpoint="chat", model="m", estimated_tokens=1))
        await asyncio.sleep(0.3)
        assert time.perf_counter() - started < 0.6  # the loop kept running while the lock was held
        assert not task.done()  # queued for the writer thread, which waits for the lock
    finally:
        holder.execute("COMMIT")
        holder.close()
    admission = await asyncio.wait_for(task, 10)
    assert rows(db, "SELECT request_id FROM reservations") == [("blocked",)]
    await meter.settle(admission, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)
    assert meter.in_flight == 0


async def test_requests_in_flight_are_counted_until_settled_released_refused_or_cancelled(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, max_concurrent=1)
    first = await meter.admit(key, request_id="a", endpoint="chat", model="m", estimated_tokens=1)
    assert meter.in_flight == 1
    with pytest.raises(RateLimited):
        await meter.admit(key, request_id="b", endpoint="chat", model="m", estimated_tokens=1)
    assert meter.in_flight == 1  # the refused one is not counted
    await meter.release(first, status=499, model="m")
    await meter.release(first, status=499, model="m")  # twice: counted down once
    assert meter.in_flight == 0
    second = await meter.admit(key, request_id="c", endpoint="chat", model="m", estimated_tokens=1)
    task = asyncio.create_task(meter.admit(key, request_id="d", endpoint="chat", model="m", estimated_tokens=1))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises((asyncio.CancelledError, RateLimited)):
        await task
    assert meter.in_flight == 1
    await meter.settle(second, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)
    assert meter.in_flight == 0
