"""A key's lifecycle through the real daemon: rotation, expiry changes, the expiry alert, and renaming a team.

Rotation keeps the key: during the overlap both secrets answer, afterwards the old one gets 401 ``rotated_api_key``,
the daily quota window keeps counting across the rotation and the usage report shows one key. Expiry is set and
cleared through ``PATCH /admin/keys/{id}`` and ``appliancectl keys expire``; a key set to expire within 14 days
raises one signed ``key.expiry`` webhook that names it as ``name (prefix…)``. A renamed team keeps its usage.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from tests.daemon import RunningDaemon, start_daemon
from tests.integration.test_backup_restore import ctl
from tests.webhookkit import Receiver

BODY = {"model": "default", "max_tokens": 4, "temperature": 0.0}
SECRET = "webhook-secret-for-the-expiry-test"

pytestmark = pytest.mark.slow


def _complete(daemon: RunningDaemon, secret: str, prompt: str) -> tuple[int, dict]:
    with daemon.client(secret) as client:
        response = client.post("/v1/completions", json={**BODY, "prompt": prompt}, headers={"Cache-Control": "no-cache"})
    return response.status_code, response.json()


def _spent_today(daemon: RunningDaemon, key_id: int) -> float:
    with daemon.admin() as admin:
        return admin.get(f"/admin/quotas/key:{key_id}").json()["usage"]["tokens_per_day"]["spent"]


def test_a_rotated_key_answers_on_both_secrets_until_the_overlap_ends_and_keeps_counting(daemon):
    with daemon.admin() as admin:
        created = admin.post("/admin/keys/", json={"name": "rotating-app"}).json()
        key_id, old_secret = created["id"], created["secret"]
        admin.put(f"/admin/quotas/key:{key_id}", json={"tokens_per_day": 100000}).raise_for_status()
    assert _complete(daemon, old_secret, "One, two,")[0] == 200
    before = _spent_today(daemon, key_id)
    assert before > 0
    with daemon.admin() as admin:
        rotated = admin.post(f"/admin/keys/{key_id}/rotate", json={"overlap_hours": 0.002}).json()  # 7.2 s
    new_secret = rotated["secret"]
    assert rotated["id"] == key_id and rotated["name"] == "rotating-app" and rotated["old_prefix"] == old_secret[:12]
    assert new_secret.startswith("ak_") and rotated["prefix"] == new_secret[:12] != old_secret[:12]

    assert _complete(daemon, old_secret, "Three, four,")[0] == 200  # in the overlap
    status, body = _complete(daemon, new_secret, "Five, six,")
    assert status == 200
    assert _spent_today(daemon, key_id) >= before + body["usage"]["total_tokens"]  # the day's window was not reset

    time.sleep(max(0.0, rotated["old_valid_until"] - time.time()) + 0.5)
    status, refused = _complete(daemon, old_secret, "Seven,")
    assert status == 401 and refused["error"]["code"] == "rotated_api_key"
    assert "rotated; use the new key" in refused["error"]["message"]
    assert _complete(daemon, new_secret, "Eight,")[0] == 200

    with daemon.admin() as admin:
        rows = admin.get("/admin/usage", params={"by": "key", "key": str(key_id)}).json()["rows"]
    assert [(r["key_id"], r["key"], r["requests"]) for r in rows] == [(key_id, new_secret[:12], 4)]  # one key, all four
    with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
        audit = conn.execute("SELECT actor, detail FROM audit_log WHERE action = 'key.rotate' AND target = ?", (new_secret[:12],))
        assert audit.fetchall() == [("local-admin", f"old={old_secret[:12]} overlap_hours=0.002")]


def test_expiry_is_changed_through_the_api_and_the_cli(daemon):
    with daemon.admin() as admin:
        created = admin.post("/admin/keys/", json={"name": "expiring-app"}).json()
        key_id, secret = created["id"], created["secret"]
        soon = admin.patch(f"/admin/keys/{key_id}", json={"expires_in_days": 5}).json()
        assert soon["expires_at"] == pytest.approx(time.time() + 5 * 86400, abs=60)
        past = admin.patch(f"/admin/keys/{key_id}", json={"expires_at": time.time() - 60})
        assert past.status_code == 400 and past.json()["error"]["param"] == "expires_at"
        listed = admin.get("/admin/keys/expiring").json()
        assert {"key_id": key_id, "label": f"expiring-app ({secret[:12]}…)", "what": "key"}.items() <= next(
            e for e in listed if e["key_id"] == key_id
        ).items()
        assert admin.patch(f"/admin/keys/{key_id}", json={"expires_at": None}).json()["expires_at"] is None
    assert _complete(daemon, secret, "Red, green,")[0] == 200

    result = ctl(daemon, "keys", "expire", secret[:12], "--in-days", "3")
    assert result.returncode == 0, result.stderr
    assert f"expiring-app ({secret[:12]}…) expires" in result.stdout
    result = ctl(daemon, "keys", "expiring")
    assert result.returncode == 0 and "expiring-app" in result.stdout, result.stdout + result.stderr
    result = ctl(daemon, "keys", "expire", str(key_id), "--never")
    assert result.returncode == 0 and "never expires" in result.stdout, result.stderr

    result = ctl(daemon, "keys", "rotate", str(key_id), "--overlap-hours", "0")
    assert result.returncode == 0, result.stderr
    new_secret = result.stdout.strip().splitlines()[-1]
    assert new_secret.startswith("ak_") and new_secret != secret
    assert _complete(daemon, new_secret, "Blue,")[0] == 200
    assert _complete(daemon, secret, "Yellow,")[0] == 401


def test_a_renamed_team_keeps_its_usage_under_the_new_name(daemon):
    with daemon.admin() as admin:
        team = admin.post("/admin/teams", json={"name": "research"}).json()
        secret = admin.post("/admin/keys/", json={"name": "team-app", "team_id": team["id"]}).json()["secret"]
    assert _complete(daemon, secret, "Alpha,")[0] == 200
    with daemon.admin() as admin:
        renamed = admin.patch("/admin/teams/research", json={"name": "science"})
        assert renamed.status_code == 200 and renamed.json()["id"] == team["id"], renamed.text
    assert _complete(daemon, secret, "Beta,")[0] == 200
    result = ctl(daemon, "teams", "rename", "science", "laboratory")
    assert result.returncode == 0 and "Renamed team science to laboratory" in result.stdout, result.stderr
    with daemon.admin() as admin:
        rows = admin.get("/admin/usage", params={"by": "team", "team": "laboratory"}).json()["rows"]
        assert [(r["team_id"], r["team"], r["requests"]) for r in rows] == [(team["id"], "laboratory", 2)]
        assert admin.get("/admin/usage", params={"team": "research"}).status_code == 400  # the old name is gone
        assert "laboratory" in [t["name"] for t in admin.get("/admin/teams").json()]


def test_a_key_set_to_expire_soon_raises_one_signed_alert_naming_it(tmp_path):
    receiver = Receiver()
    alerting = start_daemon(tmp_path, APPLIANCE_ALERT_WEBHOOK_URL=receiver.url, APPLIANCE_ALERT_WEBHOOK_SECRET=SECRET)
    try:
        with alerting.admin() as admin:
            created = admin.post("/admin/keys/", json={"name": "reporting-app"}).json()
            admin.patch(f"/admin/keys/{created['id']}", json={"expires_in_days": 2}).raise_for_status()
            admin.patch(f"/admin/keys/{created['id']}", json={"name": "reporting-app"}).raise_for_status()
        deadline = time.monotonic() + 30
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # another delivery round: nothing more may arrive
        assert len(receiver.received) == 1, receiver.received
        headers, body = receiver.received[0]
        assert receiver.signature_ok(headers, body, SECRET)
        payload = json.loads(body)
        assert payload["type"] == "key.expiry" and payload["subject"] == f"reporting-app ({created['prefix']}…)"
        assert payload["threshold_days"] == 14 and 1.9 < payload["days_left"] <= 2
    finally:
        alerting.stop()
        receiver.close()
