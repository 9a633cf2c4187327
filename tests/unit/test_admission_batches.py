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
    admissions = await asyncio.gather(*(meter.admit(key, request_id=f"r{i}", endpoint="chat", model="m", estimated_tokens=7)
                                        for i in range(50)))
    assert meter.writer_stats.transactions - before < 50  # batched: fewer transactions than admissions
    assert rows(db, "SELECT count(*) FROM reservations") == [(50,)]
    held = dict(rows(db, "SELECT dimension, reserved FROM quota_counters"))
    assert held == {"requests_per_minute": 50, "tokens_per_day": 350, "max_concurrent": 50}
    assert all(len(a.holds) == 3 for a in admissions)
    assert admissions[-1].headers["x-ratelimit-remaining-requests"] == "950"
    await asyncio.gather(*(meter.settle(a, model="m", prompt_tokens=3, completion_tokens=4, **SETTLE) for a in admissions))
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    assert dict(rows(db, "SELECT dimension, reserved FROM quota_counters")) == {
        "requests_per_minute": 0, "tokens_per_day": 0, "max_concurrent": 0}


async def test_a_refusal_in_a_batch_undoes_only_its_own_partial_reservation(meter, db):
    """The team's counter takes the request, the key's day budget refuses it: the team keeps no trace of it."""
    team = add_team(db, "t")
    big = add_key(db, "big", team)
    small = add_key(db, "small", team)
    set_quota(db, "team", team, tokens_per_day=10_000)
    set_quota(db, "key", small.id, tokens_per_day=100)
    results = await asyncio.gather(
        *(meter.admit(k, request_id=f"{k.name}{i}", endpoint="chat", model="m", estimated_tokens=tokens)
          for i in range(5) for k, tokens in ((big, 50), (small, 500))),
        return_exceptions=True)
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
    set_quota(db, "key", key.id, max_concurrent=1, tokens_per_day=1000)
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
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    assert dict(rows(db, "SELECT dimension, reserved FROM quota_counters")) == {"max_concurrent": 0, "tokens_per_day": 0}
    # the one concurrency slot is free again
    again = await meter.admit(key, request_id="next", endpoint="chat", model="m", estimated_tokens=10)
    with pytest.raises(RateLimited):
        await meter.admit(key, request_id="third", endpoint="chat", model="m", estimated_tokens=10)
    await meter.settle(again, model="m", prompt_tokens=10, completion_tokens=0, **SETTLE)


async def test_admission_waits_for_no_sqlite_work_on_the_event_loop(meter, db, monkeypatch):
    """With the writer running, the admitting coroutine never takes the meter's connection lock itself."""
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10)
    await meter.admit(key, request_id="warm", endpoint="chat", model="m", estimated_tokens=1)  # limits now cached
    loop_thread = asyncio.get_running_loop()._thread_id  # type: ignore[attr-defined]
    import threading

    seen = []
    real = meter._conn

    class Watch:
        def __getattr__(self, name):
            return getattr(real, name)

        def execute(self, *args):
            seen.append(threading.get_ident())
            return real.execute(*args)

    monkeypatch.setattr(meter._writer, "_conn", Watch())
    admission = await meter.admit(key, request_id="watched", endpoint="chat", model="m", estimated_tokens=1)
    assert seen and loop_thread not in seen
    await meter.settle(admission, model="m", prompt_tokens=1, completion_tokens=0, **SETTLE)
