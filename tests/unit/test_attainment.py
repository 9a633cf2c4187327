"""Latency-target attainment per model and class: hand-made rows at the class boundaries, and the ledger query."""

from __future__ import annotations

import sqlite3

import pytest

from appliance.batch.capacity import Capacity
from appliance.metering.attainment import LedgerRow, attainment, class_share, ledger_rows
from appliance.metering.box_figures import BoxFigures
from appliance.serving.router import Router
from appliance.settings import Settings
from tests.meterkit import T0, Clock, add_key, new_db

TARGETS = {"interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.1}, "batch": {"ttft_p95_s": 30.0, "tpot_p95_s": 0.5}}


def row(ttft_ms, latency_ms, tokens, klass="interactive", *, t=T0, status=200, tier="miss", model="m:q4") -> LedgerRow:
    return LedgerRow(t, model, klass, ttft_ms, latency_ms, tokens, status, tier)


@pytest.mark.parametrize(
    ("ttft_ms", "latency_ms", "tokens", "within"),
    [
        (1000.0, 1000.0 + 9 * 100.0, 10, True),  # both exactly on target
        (1000.001, 1100.0, 2, False),  # TTFT a microsecond over
        (500.0, 500.0 + 9 * 100.01, 10, False),  # TPOT just over
        (999.0, 60_000.0, 1, True),  # one token: no TPOT, judged on TTFT alone
        (2.0, 2.0, 0, True),  # nothing generated: nothing to pace
    ],
)
def test_interactive_boundaries(ttft_ms, latency_ms, tokens, within):
    found = attainment([row(ttft_ms, latency_ms, tokens)], TARGETS, since=T0)
    assert found[("m:q4", "interactive")].within == int(within)
    assert found[("m:q4", "interactive")].requests == 1


def test_the_same_timings_meet_batch_targets_but_not_interactive_ones():
    rows = [row(5000.0, 5000.0 + 99 * 400.0, 100, k) for k in ("interactive", "batch")]
    found = attainment(rows, TARGETS, since=T0)
    assert found[("m:q4", "interactive")].share == 0.0
    assert found[("m:q4", "batch")].share == 1.0
    assert found[("m:q4", "batch")].tpot_p95_s == pytest.approx(0.4)


def test_failures_cache_hits_client_errors_and_old_rows():
    rows = [
        row(100.0, 200.0, 5),  # within
        row(None, 3000.0, 0, status=503),  # the box failed it: a miss
        row(None, 100.0, 0, status=499),  # the client left: not counted
        row(None, 5.0, 0, status=400),  # a client error: not counted
        row(1.0, 2.0, 9, tier="exact"),  # a cache hit: not the engine's figure
        row(5000.0, 6000.0, 5, t=T0 - 1),  # before the window
    ]
    found = attainment(rows, TARGETS, since=T0)
    assert list(found) == [("m:q4", "interactive")]
    assert (found[("m:q4", "interactive")].requests, found[("m:q4", "interactive")].within) == (2, 1)
    assert class_share(found, "interactive") == 0.5
    assert class_share(found, "batch") is None


def test_p95_is_nearest_rank_over_the_class():
    rows = [row(float(ms), float(ms), 1) for ms in range(10, 210, 10)]  # 20 TTFTs: 10 ms .. 200 ms
    found = attainment(rows, TARGETS, since=T0)[("m:q4", "interactive")]
    assert found.ttft_p95_s == pytest.approx(0.19)
    assert found.tpot_p95_s is None


def _insert(db, rid, t, key_id, *, ttft, latency, tokens, batch_id=None, status=200):
    with sqlite3.connect(db.url.database) as conn:
        conn.execute(
            "INSERT INTO usage (request_id, created_at, key_id, endpoint, model, prompt_tokens, completion_tokens,"
            " cached_tokens, ttft_ms, latency_ms, status, cache_tier, cost, batch_id)"
            " VALUES (?, ?, ?, 'chat', 'm:q4', 3, ?, 0, ?, ?, ?, 'miss', 0, ?)",
            (rid, t, key_id, tokens, ttft, latency, status, batch_id),
        )


def test_the_class_comes_from_the_key_and_batch_lines(tmp_path):
    db = new_db(tmp_path / "a.db")
    try:
        interactive, bulk = add_key(db, "inter"), add_key(db, "bulk")
        with sqlite3.connect(db.url.database) as conn:
            conn.execute("UPDATE api_keys SET priority = 'batch' WHERE id = ?", (bulk.id,))
        _insert(db, "a", T0 + 1, interactive.id, ttft=100.0, latency=500.0, tokens=5)
        _insert(db, "b", T0 + 2, bulk.id, ttft=100.0, latency=500.0, tokens=5)
        _insert(db, "c", T0 + 3, interactive.id, ttft=100.0, latency=500.0, tokens=5, batch_id="batch_1")
        _insert(db, "d", T0 + 4, None, ttft=100.0, latency=500.0, tokens=5)
        _insert(db, "e", T0 + 500, interactive.id, ttft=100.0, latency=500.0, tokens=5)  # after the window
        got = sorted((r.created_at - T0, r.klass) for r in ledger_rows(db, T0, T0 + 100))
        assert got == [(1, "interactive"), (2, "batch"), (3, "batch"), (4, "interactive")]
    finally:
        db.dispose()


def test_batch_lines_are_held_back_while_interactive_attainment_is_low(tmp_path):
    """The batch capacity asks the ledger's figures: 1 of 3 interactive requests in target < 0.9 holds batch back,
    a batch line's own slow row does not, and setting the threshold to 0 releases it."""
    db = new_db(tmp_path / "a.db")
    clock = Clock(T0 + 100)
    try:
        key = add_key(db, "inter")
        config = Settings(data_dir=tmp_path, latency_targets=TARGETS)
        figures = BoxFigures(config, db, dict, clock=clock)
        router = Router(config, make_plan=None, make_engine_process=None)  # type: ignore[arg-type]
        capacity = Capacity(config, router, None, figures.interactive_attainment)  # type: ignore[arg-type]
        _insert(db, "slow-batch", T0, key.id, ttft=60_000.0, latency=90_000.0, tokens=5, batch_id="batch_1")
        assert capacity.may_start("m:q4")
        _insert(db, "ok", T0 + 1, key.id, ttft=100.0, latency=200.0, tokens=2)
        _insert(db, "slow", T0 + 2, key.id, ttft=4000.0, latency=4100.0, tokens=2)
        _insert(db, "failed", T0 + 3, key.id, ttft=None, latency=30.0, tokens=0, status=502)
        assert capacity.may_start("m:q4")  # not read yet: the hold-back never reads the database itself
        clock.advance(60)  # past the 5-minute window's refresh
        figures.refresh()
        assert figures.interactive_attainment() == pytest.approx(1 / 3)
        assert not capacity.may_start("m:q4")
        relaxed = Capacity(
            config.model_copy(update={"batch_holdback_attainment": 0.0}), router, None, figures.interactive_attainment
        )  # type: ignore[arg-type]
        assert relaxed.may_start("m:q4")
        clock.advance(400)  # the slow requests leave the 5-minute window
        figures.refresh()
        assert figures.interactive_attainment() is None and capacity.may_start("m:q4")
    finally:
        db.dispose()
