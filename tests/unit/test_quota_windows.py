"""Limits set mid-window count the window's ledger; refusals say what is used and reserved (real SQLite, real meter)."""

from __future__ import annotations

import pytest

from appliance.errors import QuotaExceeded, RateLimited
from appliance.metering.admin import QuotaService
from appliance.metering.quotas import DAY
from tests.meterkit import add_key, add_team, rows, set_quota

SETTLE = dict(variant=None, backend="llamacpp", cached_tokens=0, ttft_ms=5.0, latency_ms=20.0, status=200)


def admit(meter, principal, rid, tokens=100, **kw):
    return meter.admit_now(principal, request_id=rid, endpoint="chat", model="m", estimated_tokens=tokens, **kw)


async def spend(meter, principal, rid, prompt, completion, **kw):
    admission = admit(meter, principal, rid, tokens=prompt)
    await meter.settle(admission, model="m", prompt_tokens=prompt, completion_tokens=completion, **{**SETTLE, **kw})


@pytest.fixture
def quotas(db, meter, clock):
    return QuotaService(db, meter, clock=clock)


async def test_a_limit_set_after_the_spending_refuses_the_next_request(meter, db, quotas):
    key = add_key(db)
    await spend(meter, key, "a", 300, 100)
    await spend(meter, key, "b", 50, 16)
    quotas.set_quota(f"key:{key.id}", {"tokens_per_day": 400}, "admin")
    with pytest.raises(QuotaExceeded) as info:
        admit(meter, key, "c", tokens=5, cap=True, max_tokens=10)
    assert info.value.message == "The tokens per day budget of this key is over its limit: 466 used of 400."
    usage = quotas.get_quota(f"key:{key.id}")["usage"]["tokens_per_day"]
    assert (usage["spent"], usage["reserved"], usage["remaining"], usage["state"]) == (466, 0, 0, "over")


async def test_a_counter_made_by_an_admission_starts_from_the_ledger(meter, db, quotas):
    """A quota row written without the service (a restore, another tool): the first admission still counts the window."""
    key = add_key(db)
    await spend(meter, key, "a", 200, 100)
    set_quota(db, "key", key.id, tokens_per_day=350, requests_per_minute=2)
    meter.invalidate_quotas()
    with pytest.raises(QuotaExceeded) as info:
        admit(meter, key, "b", tokens=60, cap=True, max_tokens=10)
    assert info.value.message == (
        "The tokens per day budget of this key cannot hold this request: 300 used of 350, 50 left; it needs 61."
    )
    admitted = admit(meter, key, "c", tokens=40, cap=True, max_tokens=100)
    assert admitted.max_tokens == 10  # capped to what the window has left after the ledger's 300
    assert dict(rows(db, "SELECT dimension, spent FROM quota_counters")) == {"requests_per_minute": 1.0, "tokens_per_day": 300.0}
    with pytest.raises(RateLimited):  # the minute's one ledger row and the request in flight fill its two
        admit(meter, key, "d", tokens=1, cap=True, max_tokens=1)
    await meter.release(admitted, status=499, model="m")


async def test_a_lowered_limit_recounts_a_window_the_counter_missed(meter, db, quotas):
    """Spending while the key had no quota is counted when a limit comes back in the same window."""
    key = add_key(db)
    quotas.set_quota(f"key:{key.id}", {"tokens_per_day": 10_000}, "admin")
    await spend(meter, key, "a", 100, 0)
    quotas.delete_quota(f"key:{key.id}", "admin")
    await spend(meter, key, "b", 500, 0)  # no quota: the counter is not touched
    quotas.set_quota(f"key:{key.id}", {"tokens_per_day": 550}, "admin")
    usage = quotas.get_quota(f"key:{key.id}")["usage"]["tokens_per_day"]
    assert (usage["spent"], usage["state"]) == (600, "over")
    with pytest.raises(QuotaExceeded):
        admit(meter, key, "c", tokens=1, cap=True, max_tokens=1)


async def test_a_team_limit_counts_only_the_teams_rows_of_the_window(meter, db, quotas, clock):
    team = add_team(db, "t")
    key = add_key(db, "member", team_id=team)
    other = add_key(db, "outsider")
    await spend(meter, key, "yesterday", 900, 0)
    clock.advance(DAY)
    await spend(meter, key, "today", 120, 30)
    await spend(meter, other, "other", 700, 0)
    quotas.set_quota("team:t", {"tokens_per_day": 1000, "requests_per_minute": 5}, "admin")
    usage = quotas.get_quota("team:t")["usage"]
    assert usage["tokens_per_day"]["spent"] == 150 and usage["tokens_per_day"]["state"] == "ok"
    assert usage["requests_per_minute"]["spent"] == 1


async def test_cache_hits_count_as_the_setting_says(tmp_path, db, clock):
    from appliance.metering.meter import Meter
    from tests.meterkit import settings

    meter = Meter(settings(tmp_path, cache_counts_against_quota=False), db, clock=clock)
    await meter.start()
    try:
        quotas = QuotaService(db, meter, clock=clock)
        key = add_key(db)
        await spend(meter, key, "miss", 100, 50)
        admission = meter.admit_now(key, request_id="hit", endpoint="chat", model="m", estimated_tokens=80, cached=True)
        await meter.settle(
            admission, model="m", prompt_tokens=60, completion_tokens=20, **{**SETTLE, "cached_tokens": 60}, cache_tier="exact"
        )
        quotas.set_quota(f"key:{key.id}", {"tokens_per_day": 1000}, "admin")
        assert quotas.get_quota(f"key:{key.id}")["usage"]["tokens_per_day"]["spent"] == 150
    finally:
        await meter.stop()
        meter.close()


async def test_a_refusal_by_reservations_says_used_and_reserved(meter, db, quotas):
    key = add_key(db)
    quotas.set_quota(f"key:{key.id}", {"tokens_per_day": 1000}, "admin")
    await spend(meter, key, "done", 20, 0)
    held = admit(meter, key, "running", tokens=700, cap=True, max_tokens=200)
    with pytest.raises(QuotaExceeded) as info:
        admit(meter, key, "next", tokens=700, cap=True, max_tokens=10)
    assert info.value.message == (
        "The tokens per day budget of this key cannot hold this request: 20 used and 900 reserved by requests in flight"
        " of 1000, 80 left; it needs 701."
    )
    await meter.release(held, status=499, model="m")


async def test_a_rate_refusal_names_what_is_reserved(meter, db, quotas):
    key = add_key(db)
    quotas.set_quota(f"key:{key.id}", {"tokens_per_minute": 500}, "admin")
    held = admit(meter, key, "running", tokens=400)
    with pytest.raises(RateLimited) as info:
        admit(meter, key, "next", tokens=200)
    assert info.value.message == (
        "Rate limit reached for this key: tokens per minute limit 500 (0 used and 400 reserved by requests in flight);"
        " it needs 200."
    )
    await meter.release(held, status=499, model="m")
