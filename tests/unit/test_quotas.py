"""Quota admission, settle and release against a real SQLite file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.accounts.keys import Principal
from appliance.errors import QuotaExceeded, RateLimited
from appliance.metering.admin import QuotaService
from appliance.metering.meter import Meter
from appliance.metering.pricing import PriceBook, Rate, cost_of
from appliance.metering.quotas import completion_cap, format_duration, month_bounds
from tests.meterkit import T0, add_key, add_team, rows, set_price, set_quota, settings

SETTLE = dict(variant=None, backend="llamacpp", cached_tokens=0, ttft_ms=5.0, latency_ms=20.0, status=200)


def admit(meter, principal, rid, tokens=100, **kw):
    return meter.admit_now(principal, request_id=rid, endpoint="chat", model="m", estimated_tokens=tokens, **kw)


async def settle(meter, admission, prompt=10, completion=20, **kw):
    return await meter.settle(
        admission, model=kw.pop("model", "m"), prompt_tokens=prompt, completion_tokens=completion, **{**SETTLE, **kw}
    )


def counter(db, subject_type, subject_id, dimension):
    found = rows(
        db,
        "SELECT limit_value, spent, reserved FROM quota_counters WHERE subject_type = ? AND subject_id = ? AND dimension = ?"
        " ORDER BY window_start DESC",
        subject_type,
        subject_id,
        dimension,
    )
    return found[0] if found else None


async def test_no_quota_writes_nothing_at_admission(meter, db):
    key = add_key(db)
    a = admit(meter, key, "r1")
    assert a.holds == () and a.headers == {}
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    assert rows(db, "SELECT count(*) FROM quota_counters") == [(0,)]
    await settle(meter, a)
    assert rows(db, "SELECT request_id, key_id, prompt_tokens, completion_tokens, status FROM usage") == [
        ("r1", key.id, 10, 20, 200)
    ]


async def test_requests_per_minute_refuses_with_openai_headers(meter, db, clock):
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=3, tokens_per_minute=1000)
    seen = []
    for i in range(3):
        a = admit(meter, key, f"r{i}")
        seen.append(a.headers["x-ratelimit-remaining-requests"])
        await settle(meter, a)
    assert seen == ["2", "1", "0"]
    assert a.headers["x-ratelimit-limit-requests"] == "3"
    assert a.headers["x-ratelimit-limit-tokens"] == "1000"
    assert a.headers["x-ratelimit-remaining-tokens"] == str(1000 - 2 * 30 - 100)
    assert a.headers["x-ratelimit-reset-requests"] == "30s"  # clock sits 30 s into the minute
    with pytest.raises(RateLimited) as info:
        admit(meter, key, "r3")
    exc = info.value
    assert type(exc) is RateLimited and exc.status == 429 and exc.code == "rate_limit_exceeded"
    assert exc.headers["Retry-After"] == "30"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert exc.headers["x-ratelimit-remaining-tokens"] == str(1000 - 90)
    clock.advance(30)  # next minute: a new window
    admit(meter, key, "r4")


async def test_token_budget_is_quota_exceeded_and_too_large_is_explained(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_day=250)
    a = admit(meter, key, "r1", tokens=200)
    with pytest.raises(QuotaExceeded) as info:
        admit(meter, key, "r2", tokens=100)
    assert info.value.code == "insufficient_quota" and "budget" in info.value.message
    await settle(meter, a, prompt=40, completion=10)  # used 50 of the 200 held
    admit(meter, key, "r3", tokens=200)
    with pytest.raises(QuotaExceeded) as info:
        admit(meter, key, "r4", tokens=300)
    assert "too large" in info.value.message


async def test_team_quota_is_shared_by_its_keys(meter, db):
    team = add_team(db, "blue")
    k1, k2 = add_key(db, "one", team), add_key(db, "two", team)
    set_quota(db, "team", team, requests_per_minute=2)
    admit(meter, k1, "a")
    admit(meter, k2, "b")
    with pytest.raises(RateLimited) as info:
        admit(meter, k1, "c")
    assert "team" in info.value.message
    admit(meter, add_key(db, "lone"), "d")  # no team, no limit


async def test_max_concurrent_is_released_at_settle_and_release(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, max_concurrent=2)
    a, b = admit(meter, key, "a"), admit(meter, key, "b")
    with pytest.raises(RateLimited) as info:
        admit(meter, key, "c")
    assert info.value.headers["Retry-After"] == "1"
    await settle(meter, a)
    c = admit(meter, key, "c")
    await meter.release(b, status=499, model="m", completion_tokens=3)
    await meter.release(c, status=503, model="m")
    assert counter(db, "key", key.id, "max_concurrent") == (2.0, 0.0, 0.0)
    assert rows(db, "SELECT request_id, status, completion_tokens FROM usage ORDER BY id") == [
        ("a", 200, 20),
        ("b", 499, 3),
        ("c", 503, 0),
    ]


async def test_cost_budget_reserves_at_the_highest_rate_and_charges_the_real_cost(meter, db):
    key = add_key(db)
    set_price(db, "m", input_per_m=1.0, output_per_m=2.0)
    set_price(db, "m:big", input_per_m=4.0, output_per_m=8.0)
    set_quota(db, "key", key.id, cost_per_month=0.002)
    a = admit(meter, key, "r1", tokens=100)  # family only: could be m:big, so 100 x 8 / 1M held
    assert counter(db, "key", key.id, "cost_per_month")[2] == pytest.approx(100 * 8 / 1e6)
    cost = await settle(meter, a, model="m", variant="big", prompt=50, completion=50)
    assert cost == pytest.approx((50 * 4 + 50 * 8) / 1e6)
    _, spent, reserved = counter(db, "key", key.id, "cost_per_month")
    assert spent == pytest.approx(cost) and reserved == 0
    assert rows(db, "SELECT cost FROM usage")[0][0] == pytest.approx(cost)
    await settle(meter, admit(meter, key, "r2", tokens=100), model="m", variant="big", prompt=0, completion=100)
    assert counter(db, "key", key.id, "cost_per_month")[1] == pytest.approx(0.0014)
    with pytest.raises(QuotaExceeded):  # 0.0014 spent + 0.0008 held > 0.002
        admit(meter, key, "r9", tokens=100)


@pytest.mark.parametrize("counts", [True, False])
async def test_cache_hits_are_priced_as_cached_and_count_only_if_configured(tmp_path, db, clock, counts):
    meter = Meter(settings(tmp_path, cache_counts_against_quota=counts), db, clock=clock)
    key = add_key(db)
    set_price(db, "*", input_per_m=1.0, output_per_m=1.0, cached_per_m=0.1)
    set_quota(db, "key", key.id, tokens_per_day=1000)
    a = admit(meter, key, "r1", tokens=100)  # admitted before the cache answered
    cost = await settle(meter, a, prompt=30, completion=70, cache_tier="exact")
    assert cost == pytest.approx(100 * 0.1 / 1e6)
    assert counter(db, "key", key.id, "tokens_per_day") == (1000.0, 100.0 if counts else 0.0, 0.0)
    b = admit(meter, key, "r2", tokens=100, cached=True)
    assert b.holds[0].amount == (100 if counts else 0)
    meter.close()


async def test_engine_prefix_cache_tokens_are_priced_at_the_cached_rate(meter, db):
    set_price(db, "*", input_per_m=1.0, output_per_m=2.0, cached_per_m=0.5)
    a = admit(meter, add_key(db), "r1")
    cost = await settle(meter, a, prompt=100, completion=10, cached_tokens=60)
    assert cost == pytest.approx((40 * 1 + 60 * 0.5 + 10 * 2) / 1e6)


async def test_quota_changes_apply_to_the_next_request(meter, db):
    key = add_key(db)
    service = QuotaService(db, meter, clock=meter._clock)
    admit(meter, key, "r0")  # caches "no quota" for this key
    service.set_quota(f"key:{key.id}", {"requests_per_minute": 1}, actor="user:alice")
    admit(meter, key, "r1")
    with pytest.raises(RateLimited):
        admit(meter, key, "r2")
    service.set_quota(f"key:{key.name}", {"requests_per_minute": 5}, actor="user:alice")  # raises the running window too
    admit(meter, key, "r2")
    assert counter(db, "key", key.id, "requests_per_minute")[0] == 5.0
    service.set_quota(f"key:{key.id}", {"requests_per_minute": None}, actor="user:alice")
    assert admit(meter, key, "r3").holds == ()
    audit = rows(db, "SELECT actor, action, target, detail FROM audit_log ORDER BY id")
    assert [(a, b, c) for a, b, c, _ in audit] == [("user:alice", "quota.set", f"key:{key.name}")] * 3
    assert json.loads(audit[0][3])["after"]["requests_per_minute"] == 1


async def test_price_changes_apply_to_the_next_settle(meter, db):
    service = QuotaService(db, meter)
    key = add_key(db)
    assert await settle(meter, admit(meter, key, "r0"), prompt=1_000_000, completion=0) == 0.0
    service.set_price("m", {"input_per_m": 2.0}, actor="local-admin")
    assert await settle(meter, admit(meter, key, "r1"), prompt=1_000_000, completion=0) == pytest.approx(2.0)
    assert rows(db, "SELECT actor, action, target FROM audit_log") == [("local-admin", "price.set", "m")]


async def test_release_stale_never_returns_a_hold_twice(meter, db, clock):
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_day=1000)
    old = admit(meter, key, "old", tokens=300)
    clock.advance(1000)
    young = admit(meter, key, "young", tokens=200)
    assert meter.release_stale(older_than_s=500) == 1
    assert counter(db, "key", key.id, "tokens_per_day") == (1000.0, 0.0, 200.0)
    await settle(meter, old, prompt=50, completion=50)  # the slow request finishes after all
    assert counter(db, "key", key.id, "tokens_per_day") == (1000.0, 100.0, 200.0)  # young's hold intact
    await settle(meter, young, prompt=10, completion=10)
    assert counter(db, "key", key.id, "tokens_per_day") == (1000.0, 120.0, 0.0)


async def test_start_releases_reservations_a_crash_left(tmp_path, db, clock):
    key = add_key(db)
    set_quota(db, "key", key.id, max_concurrent=1, tokens_per_day=500)
    crashed = Meter(settings(tmp_path), db, clock=clock)
    crashed.admit_now(key, request_id="lost", endpoint="chat", model="m", estimated_tokens=400)
    crashed.close()  # never settled: as if killed
    meter = Meter(settings(tmp_path), db, clock=clock)
    await meter.start()
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    assert counter(db, "key", key.id, "max_concurrent")[2] == 0
    admit(meter, key, "next", tokens=400)
    await meter.stop()
    meter.close()


async def test_settle_twice_writes_one_row(meter, db):
    a = admit(meter, add_key(db), "r1")
    assert await settle(meter, a) == await settle(meter, a)
    await meter.release(a, status=499, model="m")
    assert rows(db, "SELECT count(*) FROM usage") == [(1,)]


async def test_console_user_and_local_admin_are_not_keys(meter, db):
    user = Principal(kind="user", id=7, name="alice", role="admin")
    local = Principal(kind="local", id=None, name="local-admin", role="admin")
    await settle(meter, admit(meter, user, "u"))
    await settle(meter, admit(meter, local, "l"))
    assert rows(db, "SELECT key_id, team_id FROM usage") == [(None, None), (None, None)]


async def test_usage_row_is_dated_at_admission(meter, db, clock):
    a = admit(meter, add_key(db), "r1")
    clock.advance(120)
    await settle(meter, a)
    assert rows(db, "SELECT created_at FROM usage") == [(T0 + 30.0,)]


async def test_a_keys_last_use_is_written_with_its_ledger_rows(meter, db, clock):
    key = add_key(db, "a")
    add_key(db, "b")
    first = admit(meter, key, "r1")
    clock.advance(60)
    second = admit(meter, key, "r2")
    await settle(meter, second)
    await meter.release(first, status=499, model="m")  # settled later, but admitted earlier
    assert rows(db, "SELECT name, last_used_at FROM api_keys ORDER BY name") == [("a", T0 + 90.0), ("b", None)]


def test_price_lookup_order():
    book = PriceBook(lambda: [("*", 9, 9, 9), ("fam", 1, 1, 1), ("fam:q8", 2, 2, 2)])
    assert book.rate("fam", "q8") == Rate(2, 2, 2)
    assert book.rate("fam:q8") == Rate(2, 2, 2)
    assert book.rate("fam:q4") == Rate(1, 1, 1)
    assert book.rate("other") == Rate(9, 9, 9)
    assert book.highest_rate("fam") == 2
    assert PriceBook(lambda: []).rate("x") == Rate()
    assert cost_of(Rate(1, 2, 0.5), prompt_tokens=10, completion_tokens=5, cached_tokens=99, cache_hit=False) == pytest.approx(
        (10 * 0.5 + 10) / 1e6
    )


def test_windows_and_durations():
    assert month_bounds(T0 - 1) == (T0 - 31 * 86400, T0)  # December
    assert format_duration(0.02) == "20ms"
    assert format_duration(6) == "6s"
    assert format_duration(90) == "1m30s"
    assert format_duration(26 * 3600) == "26h0m0s"


async def test_prune_counters_keeps_running_windows(meter, db, clock):
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=100, tokens_per_day=10**6, cost_per_month=10.0, max_concurrent=5)
    await settle(meter, admit(meter, key, "old"))
    clock.advance(2 * 3600)
    await settle(meter, admit(meter, key, "new"))
    assert meter.prune_counters() == 1  # the minute window two hours ago
    assert sorted(d for (d,) in rows(db, "SELECT dimension FROM quota_counters")) == [
        "cost_per_month",
        "max_concurrent",
        "requests_per_minute",
        "tokens_per_day",
    ]


async def test_settle_after_stop_is_still_written(tmp_path, db, clock):
    meter = Meter(settings(tmp_path), db, clock=clock)
    await meter.start()
    a = admit(meter, add_key(db), "late")
    await meter.stop()
    await settle(meter, a)
    assert rows(db, "SELECT request_id FROM usage") == [("late",)]
    meter.close()


# -- the completion cap: one request cannot overrun a token or cost budget -------------------------------

allowance = st.tuples(st.floats(-1e3, 1e7, allow_nan=False), st.one_of(st.just(1.0), st.just(0.0), st.floats(1e-9, 1e-3)))


@given(st.integers(0, 10**6), st.one_of(st.none(), st.integers(1, 10**6)), st.lists(allowance, max_size=5))
def test_completion_cap_is_the_largest_that_fits_every_counter(prompt, requested, allowances):
    cap = completion_cap(prompt, requested, allowances)
    bounded = [(r, per) for r, per in allowances if per > 0]
    if not bounded:
        assert cap == requested
        return
    assert cap is not None
    if requested is not None:
        assert cap <= requested
    if cap >= 1:
        assert all((prompt + cap) * per <= r for r, per in bounded)  # never more than what is left
        if cap != requested:  # and not smaller than it must be
            assert any((prompt + cap + 1) * per > r for r, per in bounded)
    else:  # the prompt plus one token does not fit some counter
        assert any((prompt + 1) * per > r for r, per in bounded)


def capped(meter, principal, rid, prompt=10, max_tokens=None, model="m"):
    return meter.admit_now(
        principal, request_id=rid, endpoint="chat", model=model, estimated_tokens=prompt, cap=True, max_tokens=max_tokens
    )


async def test_cap_reserves_prompt_plus_the_allowance_left_and_shares_it_exactly(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_day=1000)
    a = capped(meter, key, "a", prompt=100)
    assert (a.max_tokens, a.estimated_tokens) == (900, 1000)
    with pytest.raises(QuotaExceeded):  # nothing left for anyone else while it runs
        capped(meter, key, "b", prompt=10)
    await settle(meter, a, prompt=40, completion=60)
    b = capped(meter, key, "b", prompt=10, max_tokens=50)
    assert b.max_tokens == 50  # asked for less than is left: unchanged
    c = capped(meter, key, "c", prompt=10, max_tokens=100000)
    assert c.max_tokens == 1000 - 100 - 60 - 10
    assert counter(db, "key", key.id, "tokens_per_day") == (1000.0, 100.0, 900.0)


async def test_cap_takes_the_tightest_of_key_and_team_tokens_and_cost(meter, db):
    team = add_team(db, "t")
    key = add_key(db, "k", team)
    set_price(db, "m", input_per_m=1000.0, output_per_m=2000.0)  # 0.002 per token at the highest rate
    set_quota(db, "key", key.id, tokens_per_month=5000)
    set_quota(db, "team", team, tokens_per_day=3000, cost_per_month=1.0)  # 1.0 / 0.002 = 500 tokens
    a = capped(meter, key, "a", prompt=100)
    assert a.max_tokens == 400
    assert counter(db, "team", team, "cost_per_month")[2] == pytest.approx(0.002 * 500)
    cost = await settle(meter, a, prompt=100, completion=400)
    assert cost <= 1.0
    assert counter(db, "team", team, "cost_per_month")[1] <= 1.0


async def test_a_prompt_that_does_not_fit_is_refused_and_holds_nothing(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, tokens_per_day=100)
    with pytest.raises(QuotaExceeded, match="needs 101, limit 100"):
        capped(meter, key, "a", prompt=100)
    assert rows(db, "SELECT count(*) FROM reservations") == [(0,)]
    a = capped(meter, key, "b", prompt=99)
    assert a.max_tokens == 1


async def test_no_budget_no_cap(meter, db):
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=10)
    assert capped(meter, key, "a", prompt=10).max_tokens is None
    assert capped(meter, key, "b", prompt=10, max_tokens=7).max_tokens == 7  # the engine gets what was asked
