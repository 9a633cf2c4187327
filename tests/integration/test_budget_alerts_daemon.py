"""Budget alerts through the real daemon: crossing a soft limit raises one alert, audited and delivered, signed.

The daemon serves the default model with a webhook pointing at a real receiver on loopback; a
key with a daily token budget and a 5% alert share sends requests past it. Exactly one webhook
arrives (with a valid HMAC), however many requests follow, and one ``budget.alert`` audit row.
A second daemon whose webhook points where nothing listens answers its requests as fast.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time

import pytest

from tests.daemon import RunningDaemon, start_daemon
from tests.webhookkit import Receiver, closed_port_url

SECRET = "webhook-secret-for-the-test"
BODY = {"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}

pytestmark = pytest.mark.slow


def _budgeted_key(daemon: RunningDaemon) -> str:
    secret = daemon.create_key("alerted")
    with daemon.admin() as admin:
        admin.put(f"/admin/quotas/key:{secret[:12]}", json={"tokens_per_day": 300, "alert_percent": 5}).raise_for_status()
    return secret


def _latencies(daemon: RunningDaemon, secret: str, n: int) -> list[float]:
    out = []
    with daemon.client(secret) as client:
        for i in range(n):
            started = time.perf_counter()
            response = client.post("/v1/completions", json={**BODY, "seed": i}, headers={"Cache-Control": "no-cache"})
            assert response.status_code == 200, response.text
            out.append(time.perf_counter() - started)
    return out


def _audit(daemon: RunningDaemon) -> list[tuple]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
        return conn.execute("SELECT actor, target, detail FROM audit_log WHERE action = 'budget.alert'").fetchall()


def test_one_signed_alert_per_window_and_a_dead_receiver_costs_nothing(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    receiver = Receiver()
    alerting = start_daemon(tmp_path / "a", APPLIANCE_ALERT_WEBHOOK_URL=receiver.url, APPLIANCE_ALERT_WEBHOOK_SECRET=SECRET)
    try:
        secret = _budgeted_key(alerting)
        delivered_lat = _latencies(alerting, secret, 6)  # 15 or more tokens each: past 5% of 300 at the first
        deadline = time.monotonic() + 30
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # another scheduler round: nothing more may arrive
        assert len(receiver.received) == 1, receiver.received
        headers, body = receiver.received[0]
        assert receiver.signature_ok(headers, body, SECRET)
        payload = json.loads(body)
        assert (payload["subject"], payload["dimension"], payload["limit"], payload["percent"]) == (
            f"alerted ({secret[:12]}…)",
            "tokens_per_day",
            300.0,
            5.0,
        )
        assert payload["spent"] >= 15
        assert _audit(alerting) == [
            ("system", f"alerted ({secret[:12]}…)", f"tokens_per_day reached 5% of its limit: {payload['spent']:g} of 300")
        ]
    finally:
        alerting.stop()
        receiver.close()

    down = start_daemon(tmp_path / "b", APPLIANCE_ALERT_WEBHOOK_URL=closed_port_url(), APPLIANCE_ALERT_WEBHOOK_SECRET=SECRET)
    try:
        secret = _budgeted_key(down)
        undelivered_lat = _latencies(down, secret, 6)
        with sqlite3.connect(down.data_dir / "appliance.db") as conn:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                attempts, error = conn.execute("SELECT attempts, last_error FROM budget_alerts").fetchone()
                if attempts:
                    break
                time.sleep(0.2)
        assert attempts >= 1 and "could not reach" in error
        assert len(_audit(down)) == 1
    finally:
        down.stop()
    # the first request of each loads the model; compare the rest
    print(
        f"median latency with the webhook delivered {statistics.median(delivered_lat[1:]):.3f} s,"
        f" with the receiver down {statistics.median(undelivered_lat[1:]):.3f} s"
    )
    assert statistics.median(undelivered_lat[1:]) < 2 * statistics.median(delivered_lat[1:]) + 0.25
