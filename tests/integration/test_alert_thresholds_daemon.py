"""Budget alerts at several thresholds through the real daemon: with ``budget_alert_thresholds`` at 10, 20 and 30%,
a key spending past all three gets one signed webhook and one audit row for each, in order, and no more however
many requests follow in the same window."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from tests.daemon import start_daemon
from tests.webhookkit import Receiver

SECRET = "webhook-secret-for-the-thresholds-test"
BODY = {"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}

pytestmark = pytest.mark.slow


def test_each_threshold_alerts_once_per_window(tmp_path):
    receiver = Receiver()
    daemon = start_daemon(
        tmp_path,
        APPLIANCE_ALERT_WEBHOOK_URL=receiver.url,
        APPLIANCE_ALERT_WEBHOOK_SECRET=SECRET,
        APPLIANCE_BUDGET_ALERT_THRESHOLDS="[30, 10, 20]",
    )
    try:
        secret = daemon.create_key("stepped")
        with daemon.admin() as admin:
            admin.put(f"/admin/quotas/key:{secret[:12]}", json={"tokens_per_day": 300}).raise_for_status()
        with daemon.client(secret) as client:
            for i in range(9):  # 15 or more tokens each: past 30% (90 tokens) by the sixth
                response = client.post("/v1/completions", json={**BODY, "seed": i}, headers={"Cache-Control": "no-cache"})
                assert response.status_code == 200, response.text
        deadline = time.monotonic() + 30
        while len(receiver.received) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # another scheduler round: nothing more may arrive
        payloads = [json.loads(body) for _, body in receiver.received]
        assert [p["percent"] for p in payloads] == [10.0, 20.0, 30.0], payloads
        assert all(receiver.signature_ok(headers, body, SECRET) for headers, body in receiver.received)
        assert all(p["spent"] >= p["limit"] * p["percent"] / 100 for p in payloads)
        with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
            details = [d for (d,) in conn.execute("SELECT detail FROM audit_log WHERE action = 'budget.alert' ORDER BY id")]
        assert [d.split(" of its limit")[0] for d in details] == [f"tokens_per_day reached {p}%" for p in (10, 20, 30)]
    finally:
        daemon.stop()
        receiver.close()
