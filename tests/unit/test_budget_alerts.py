"""Budget alerts: raised once per window with the ledger, delivered to a real HTTP receiver, signed."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest

from appliance.metering.admin import QuotaService
from appliance.metering.alerts import (
    MAX_ATTEMPTS,
    AlertNotifier,
    default_shares,
    dismiss_alert,
    list_alerts,
    next_attempt_delay,
)
from appliance.metering.forecast import budget_forecasts, reached_at
from appliance.metering.meter import Meter
from appliance.metering.quotas import DAY
from tests.meterkit import add_key, add_team, rows, set_price, set_quota, settings
from tests.webhookkit import Receiver, closed_port_url

SETTLE = dict(variant=None, backend="llamacpp", cached_tokens=0, ttft_ms=5.0, latency_ms=20.0, status=200)
SECRET = "receiver-shared-secret"


async def spend(meter, principal, rid, completion, prompt=0):
    admission = await meter.admit(principal, request_id=rid, endpoint="chat", model="m", estimated_tokens=prompt + completion)
    await meter.settle(admission, model="m", prompt_tokens=prompt, completion_tokens=completion, **SETTLE)


def alerts(db):
    return rows(db, "SELECT subject_type, subject_id, dimension, limit_value, spent, percent FROM budget_alerts ORDER BY id")


def audit(db):
    return rows(db, "SELECT actor, action, target, detail FROM audit_log WHERE action = 'budget.alert' ORDER BY id")


async def test_crossing_the_default_share_raises_one_alert_per_window(meter, db, clock):
    key = add_key(db, "a")
    set_quota(db, "key", key.id, tokens_per_day=1000)
    await spend(meter, key, "r1", 700)
    assert alerts(db) == []  # 70% < 80%
    await spend(meter, key, "r2", 100)
    assert alerts(db) == [("key", key.id, "tokens_per_day", 1000.0, 800.0, 80.0)]
    assert audit(db) == [("system", "budget.alert", "a (ak_a…)", "tokens_per_day reached 80% of its limit: 800 of 1000")]
    await spend(meter, key, "r3", 150)
    await spend(meter, key, "r4", 10)
    assert len(alerts(db)) == 1 and len(audit(db)) == 1  # once per window, however far past the threshold
    clock.advance(DAY)  # the next day's window alerts again
    await spend(meter, key, "r5", 900)
    assert [a[4] for a in alerts(db)] == [800.0, 900.0]


async def test_a_quotas_own_share_overrides_the_setting_and_zero_silences_it(meter, db, tmp_path):
    key, quiet = add_key(db, "a"), add_key(db, "b")
    service = QuotaService(db, meter)
    service.set_quota("key:ak_a", {"tokens_per_day": 1000, "alert_percent": 50}, "local-admin")
    service.set_quota("key:ak_b", {"tokens_per_day": 1000, "alert_percent": 0}, "local-admin")
    assert service.get_quota("key:ak_a")["alert_percent"] == 50.0
    await spend(meter, key, "r1", 500)
    await spend(meter, quiet, "r2", 1000)
    assert alerts(db) == [("key", key.id, "tokens_per_day", 1000.0, 500.0, 50.0)]
    with pytest.raises(Exception, match="alert_percent must be a percentage"):
        service.set_quota("key:ak_a", {"alert_percent": 101}, "local-admin")


async def test_team_cost_budgets_alert_and_rates_never_do(meter, db):
    team = add_team(db, "research")
    key = add_key(db, "a", team)
    set_price(db, "*", input_per_m=1.0, output_per_m=1.0)
    set_quota(db, "team", team, cost_per_month=0.001, tokens_per_minute=100)
    await spend(meter, key, "r1", 90)  # 90% of the minute's tokens: a rate, not a budget
    assert alerts(db) == []
    QuotaService(db, meter).set_quota("team:research", {"tokens_per_minute": None}, "local-admin")
    await spend(meter, key, "r2", 800)  # 890 tokens at $1/M = $0.00089 of $0.001
    assert [(a[0], a[2], a[5]) for a in alerts(db)] == [("team", "cost_per_month", 80.0)]
    assert audit(db)[0][2] == "team:research"


async def test_the_setting_at_zero_raises_nothing(tmp_path, db, clock):
    m = Meter(settings(tmp_path, budget_alert_percent=0), db, clock=clock)
    await m.start()
    key = add_key(db, "a")
    set_quota(db, "key", key.id, tokens_per_day=100)
    await spend(m, key, "r1", 100)
    await m.stop()
    m.close()
    assert alerts(db) == []


async def test_several_thresholds_each_alert_once_per_window(tmp_path, db, clock):
    m = Meter(settings(tmp_path, budget_alert_thresholds=[100, 50, 80]), db, clock=clock)
    await m.start()
    try:
        key = add_key(db, "a")
        set_quota(db, "key", key.id, tokens_per_day=1000)
        await spend(m, key, "r1", 500)
        assert [a[5] for a in alerts(db)] == [50.0]
        await spend(m, key, "r2", 100)
        await spend(m, key, "r3", 100)
        assert [a[5] for a in alerts(db)] == [50.0]  # 70%: nothing new
        await spend(m, key, "r4", 300)  # 100%: past 80 and 100 in one settle, each raised
        assert [(a[4], a[5]) for a in alerts(db)] == [(500.0, 50.0), (1000.0, 80.0), (1000.0, 100.0)]
        assert len(audit(db)) == 3  # once per threshold and window (50 stayed one alert over r2 and r3)
        assert audit(db)[2][3] == "tokens_per_day reached 100% of its limit: 1000 of 1000"
        clock.advance(DAY)
        await spend(m, key, "r6", 800)
        assert [a[5] for a in alerts(db)][3:] == [50.0, 80.0]  # the next window alerts again
    finally:
        await m.stop()
        m.close()


def test_the_older_one_share_setting_wins_and_thresholds_are_checked(tmp_path):
    assert default_shares(settings(tmp_path)) == [80.0, 100.0]
    assert default_shares(settings(tmp_path, budget_alert_thresholds=[80, 50, 80])) == [50.0, 80.0]
    assert default_shares(settings(tmp_path, budget_alert_thresholds=[50], budget_alert_percent=90)) == [90.0]
    assert default_shares(settings(tmp_path, budget_alert_percent=0)) == []
    for bad in ([0], [101], [-5]):
        with pytest.raises(ValueError, match="budget_alert_thresholds"):
            settings(tmp_path, budget_alert_thresholds=bad)


# -- delivery -------------------------------------------------------------------------------
async def raise_one(meter, db):
    key = add_key(db, "a")
    set_quota(db, "key", key.id, tokens_per_day=10)
    await spend(meter, key, "r1", 8)  # 80%: the first of the default shares (80 and 100)
    assert len(alerts(db)) == 1


async def test_an_alert_is_delivered_once_with_a_valid_signature(meter, db, tmp_path, clock):
    await raise_one(meter, db)
    receiver = Receiver()
    try:
        notifier = AlertNotifier(settings(tmp_path, alert_webhook_url=receiver.url, alert_webhook_secret=SECRET), db, clock=clock)
        assert await notifier.deliver_due() == 1
        assert await notifier.deliver_due() == 0  # delivered alerts are not sent again
    finally:
        receiver.close()
    [(headers, body)] = receiver.received
    expected = hmac.new(SECRET.encode(), headers["x-appliance-timestamp"].encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers["x-appliance-signature"] == f"sha256={expected}"
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    assert payload["type"] == "budget.alert" and payload["subject"] == "a (ak_a…)"
    assert (payload["dimension"], payload["limit"], payload["spent"], payload["percent"]) == ("tokens_per_day", 10.0, 8.0, 80.0)
    assert payload["window_end"] - payload["window_start"] == DAY
    assert rows(db, "SELECT attempts, delivered_at IS NOT NULL, last_error FROM budget_alerts") == [(1, 1, None)]


async def test_a_receiver_that_is_down_or_refuses_is_retried_with_backoff(meter, db, tmp_path, clock):
    await raise_one(meter, db)
    notifier = AlertNotifier(
        settings(tmp_path, alert_webhook_url=closed_port_url(), alert_webhook_secret=SECRET), db, clock=clock
    )
    started = time.perf_counter()
    assert await notifier.deliver_due() == 0
    assert time.perf_counter() - started < 2.0  # a refused connection costs nothing like the timeout
    attempts, next_at, error = rows(db, "SELECT attempts, next_attempt_at, last_error FROM budget_alerts")[0]
    assert attempts == 1 and next_at == clock() + next_attempt_delay(1) and "could not reach" in error
    assert await notifier.deliver_due() == 0  # not due yet: nothing is tried
    assert rows(db, "SELECT attempts FROM budget_alerts") == [(1,)]

    receiver = Receiver(status=500)
    try:
        notifier = AlertNotifier(settings(tmp_path, alert_webhook_url=receiver.url, alert_webhook_secret=SECRET), db, clock=clock)
        clock.advance(next_attempt_delay(1))
        assert await notifier.deliver_due() == 0
        assert rows(db, "SELECT attempts, last_error FROM budget_alerts") == [(2, "the webhook answered 500")]
        receiver.status = 200
        clock.advance(next_attempt_delay(2))
        assert await notifier.deliver_due() == 1
    finally:
        receiver.close()
    assert len(receiver.received) == 2
    assert [next_attempt_delay(n) for n in (1, 2, 3, 20)] == [5.0, 10.0, 20.0, 3600.0]
    assert MAX_ATTEMPTS >= 5


async def test_dismissed_alerts_leave_the_open_list(meter, db):
    await raise_one(meter, db)
    [alert] = list_alerts(db, include_dismissed=False)
    assert dismiss_alert(db, alert.id) and not dismiss_alert(db, alert.id)
    assert list_alerts(db, include_dismissed=False) == [] and len(list_alerts(db)) == 1


def test_a_webhook_needs_its_secret(tmp_path):
    with pytest.raises(ValueError, match="needs alert_webhook_secret"):
        settings(tmp_path, alert_webhook_url="http://127.0.0.1:9/x")


# -- forecasts --------------------------------------------------------------------------------
def test_forecast_extrapolates_the_windows_average_rate():
    start, end = 0.0, 86400.0
    assert reached_at(500, 1000, start, end, now=21600) == 43200.0  # half spent in a quarter day: gone at noon
    assert reached_at(100, 1000, start, end, now=21600) is None  # at this rate it lasts past the window
    assert reached_at(1000, 1000, start, end, now=30) == 30  # already reached
    assert reached_at(0, 1000, start, end, now=21600) is None and reached_at(10, 1000, start, end, now=30) is None


async def test_forecasts_cover_current_budget_windows_only(meter, db, clock):
    key = add_key(db, "a")
    set_quota(db, "key", key.id, tokens_per_day=1000, requests_per_minute=100)
    await spend(meter, key, "r1", 500)
    clock.advance(3600)
    [f] = budget_forecasts(db, clock())
    assert (f.subject, f.dimension, f.spent, f.limit, f.used_percent) == ("a (ak_a…)", "tokens_per_day", 500.0, 1000.0, 50.0)
    assert f.reached_at == clock() + 3630.0  # 500 in the 3,630 s since midnight: 500 more take as long again
    clock.advance(86400)
    assert budget_forecasts(db, clock()) == []  # yesterday's counter is no forecast for today
