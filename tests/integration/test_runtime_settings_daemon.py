"""Settings changed on the running daemon through ``PATCH /admin/settings``, each seen taking effect (or waiting
for a restart) through the API.

The daemon reads a commented config file. Setting the alert webhook (URL and secret) live makes the next budget alert
arrive there, signed with the new secret, with no restart; the currency and the default model change what the API
answers at once; a restart setting is written to the file and marked pending; bad values are 400 naming the field, a
setting the environment sets is 409, and only admins may read or change settings. The file keeps its comments, and the
audit log has each change with the secret masked. Every other setting marked live is changed on one more daemon and
seen used by the next request: the log level, the request log's bounds, public metrics, the cache's switch and TTL and
whether its hits count against quotas, the request timeout, the owner's costs, the budget alert shares, the upload
limits and the batch price.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from tests.daemon import start_daemon
from tests.webhookkit import Receiver

SECRET = "runtime-webhook-secret"
CONFIG = '# written by hand\ncurrency = "USD"  # prices are in dollars\n'

pytestmark = pytest.mark.slow


def _rows(admin) -> dict[str, dict]:
    response = admin.get("/admin/settings/")
    assert response.status_code == 200, response.text
    return {row["name"]: row for row in response.json()["settings"]}


def test_settings_change_live_wait_for_restart_or_are_refused(tmp_path):
    config = tmp_path / "appliance.toml"
    config.write_text(CONFIG)
    receiver = Receiver()
    daemon = start_daemon(tmp_path, APPLIANCE_CONFIG=str(config))
    try:
        user = daemon.create_key("not-admin")
        with daemon.client(user) as client:
            assert client.get("/admin/settings/").status_code == 403
            assert client.patch("/admin/settings/", json={"currency": "EUR"}).status_code == 403
        with daemon.admin() as admin:
            rows = _rows(admin)
            assert rows["currency"] == {**rows["currency"], "value": "USD", "source": "config file", "applies": "live"}
            assert rows["engine_context"]["source"] == "environment" and rows["engine_context"]["editable"] is False

            bad = admin.patch("/admin/settings/", json={"max_loaded_instances": 0})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_loaded_instances"
            bad = admin.patch("/admin/settings/", json={"alert_webhook_url": receiver.url})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "alert_webhook_url"
            assert "alert_webhook_secret" in bad.json()["error"]["message"]
            refused = admin.patch("/admin/settings/", json={"engine_context": 1024})
            assert refused.status_code == 409 and "APPLIANCE_ENGINE_CONTEXT" in refused.json()["error"]["message"]
            assert config.read_text() == CONFIG  # nothing refused was written

            changed = admin.patch(
                "/admin/settings/",
                json={"alert_webhook_url": receiver.url, "alert_webhook_secret": SECRET, "currency": "EUR"},
            )
            assert changed.status_code == 200, changed.text
            shown = {c["name"]: c for c in changed.json()["changed"]}
            assert shown["alert_webhook_secret"]["after"] == "(set)" and SECRET not in changed.text
            assert admin.get("/admin/usage/box").json()["currency"] == "EUR"  # live: no restart

            admin.put("/admin/quotas/key:" + user[:12], json={"tokens_per_day": 300, "alert_percent": 5}).raise_for_status()
        with daemon.client(user) as client:
            body = {"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}
            for seed in range(3):
                assert client.post("/v1/completions", json={**body, "seed": seed}).status_code == 200
        deadline = time.monotonic() + 30
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.2)
        assert receiver.received, "the budget alert did not reach the webhook set at runtime"
        headers, payload = receiver.received[0]
        assert receiver.signature_ok(headers, payload, SECRET)
        assert json.loads(payload)["dimension"] == "tokens_per_day"

        with daemon.admin() as admin:
            assert admin.get("/admin/aliases").json()["default"] == "gemma-3-270m:q4_k_m"
            assert admin.patch("/admin/settings/", json={"default_model": "gemma-3-270m"}).status_code == 200
            assert admin.get("/admin/aliases").json()["default"] == "gemma-3-270m"  # the alias follows at once

            assert admin.patch("/admin/settings/", json={"queue_size": 16}).status_code == 200
            rows = _rows(admin)
            assert rows["queue_size"]["value"] == 64 and rows["queue_size"]["pending_restart"] is True
            assert rows["queue_size"]["pending_value"] == 16 and rows["queue_size"]["applies"] == "restart"

        cli_env = {**daemon.env, "APPLIANCE_CONFIG": str(config)}
        said = _appliancectl(cli_env, "config", "set", "currency", "CHF")
        assert "currency: 'EUR' -> 'CHF' (applied now)" in said
        assert "currency = 'CHF'  (config file; live)" in _appliancectl(cli_env, "config", "show")
        assert "queue_size = 64  (default; restart; pending restart: 16)" in _appliancectl(cli_env, "config", "show")

        text = config.read_text()
        assert text.startswith('# written by hand\ncurrency = "CHF"  # prices are in dollars\n')
        assert "queue_size = 16" in text and f'alert_webhook_secret = "{SECRET}"' in text
        with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
            audit = conn.execute("SELECT target, detail FROM audit_log WHERE action = 'settings.change'").fetchall()
        assert ("queue_size", "64 -> 16 (restart)") in audit
        assert ("alert_webhook_secret", "'(not set)' -> '(set)' (live)") in audit
        assert not any(SECRET in (detail or "") for _, detail in audit)
    finally:
        daemon.stop()
        receiver.close()
    # with the daemon stopped, `config set` writes the file for the next start
    said = _appliancectl(cli_env, "config", "set", "batch_max_lines", "100")
    assert "batch_max_lines: 50000 -> 100 (the daemon is not running" in said and "batch_max_lines = 100" in config.read_text()


def _appliancectl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_restart_asked_for_drains_and_exits_for_systemd_to_start_again(tmp_path):
    config = tmp_path / "appliance.toml"
    config.write_text(CONFIG)
    daemon = start_daemon(tmp_path, APPLIANCE_CONFIG=str(config))
    try:
        user = daemon.create_key("not-admin")
        with daemon.client(user) as client:
            assert client.post("/admin/settings/restart").status_code == 403
        with daemon.admin() as admin:
            answer = admin.post("/admin/settings/restart")
            assert answer.status_code == 202 and answer.json() == {"restarting": True, "comes_back": False}
        assert daemon.proc.wait(60) == 75  # Restart=on-failure starts the service again on this status
        assert "restart asked for: draining" in daemon.log()
        with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
            assert conn.execute("SELECT actor FROM audit_log WHERE action = 'daemon.restart'").fetchall() == [("local-admin",)]
    finally:
        daemon.stop()


def _complete(client, prompt: str):
    """A deterministic completion: the cache may answer a repeat of ``prompt``."""
    return client.post("/v1/completions", json={"model": "default", "prompt": prompt, "max_tokens": 8, "temperature": 0.0})


def _set(admin, **values: object) -> None:
    changed = admin.patch("/admin/settings/", json=values)
    assert changed.status_code == 200, changed.text
    assert {c["name"]: c["applies"] for c in changed.json()["changed"]} == dict.fromkeys(values, "live")


def _line(n: int = 1) -> bytes:
    body = {"model": "default", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0.0}
    return b"".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}).encode() + b"\n"
        for i in range(n)
    )


BATCH_DONE = {"completed", "failed", "expired", "cancelled"}


def _upload(client, content: bytes):
    return client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})


def test_live_settings_are_used_by_the_next_request(tmp_path):
    """Each setting marked live, changed through PATCH /admin/settings on one running daemon, is used at once."""
    config = tmp_path / "appliance.toml"
    config.write_text(CONFIG)
    # the interactive requests here miss their latency targets on a slow box: the batch must not wait for them
    daemon = start_daemon(tmp_path, APPLIANCE_CONFIG=str(config), APPLIANCE_BATCH_HOLDBACK_ATTAINMENT="0")
    try:
        user = daemon.create_key("live-settings")
        db = daemon.data_dir / "appliance.db"
        with daemon.admin() as admin, daemon.client(user) as client:
            # log_level: at warning, a settings change is no longer logged; back at info, it is again
            _set(admin, log_level="warning")
            _set(admin, currency="EUR")
            _set(admin, log_level="info")
            log = daemon.log()
            assert "setting log_level changed by local-admin (live)" in log and "setting currency changed" not in log

            # request_log_days and request_log_max_rows: the request log is pruned to the new bounds at once
            now = time.time()
            with sqlite3.connect(db) as conn:
                conn.executemany(
                    "INSERT INTO request_log (created_at, request_id, method, endpoint, status, latency_ms)"
                    " VALUES (?, ?, 'POST', '/v1/completions', 200, 1.0)",
                    [(now - 3 * 86400 if i == 0 else now, f"seeded-{i}") for i in range(1500)],
                )
            _set(admin, request_log_days=2)
            with sqlite3.connect(db) as conn:
                assert conn.execute("SELECT count(*) FROM request_log WHERE request_id = 'seeded-0'").fetchone() == (0,)
            _set(admin, request_log_max_rows=1000)
            with sqlite3.connect(db) as conn:
                kept = {r for (r,) in conn.execute("SELECT request_id FROM request_log WHERE request_id LIKE 'seeded-%'")}
            assert len(kept) <= 1000 and "seeded-1" not in kept and "seeded-1499" in kept  # the oldest went first

            # metrics_public: the access guard asks for it at each /metrics request
            assert httpx.get(daemon.url + "/metrics").status_code == 401
            _set(admin, metrics_public=True)
            assert httpx.get(daemon.url + "/metrics").status_code == 200
            _set(admin, metrics_public=None)
            assert httpx.get(daemon.url + "/metrics").status_code == 401

            # cache_enabled and cache_ttl_seconds: read at each lookup and store
            _set(admin, cache_enabled=False)
            answers = [_complete(client, "One, two,") for _ in range(2)]
            assert [a.headers["x-cache"] for a in answers] == ["miss", "miss"]
            _set(admin, cache_enabled=True)
            answers = [_complete(client, "Three, four,") for _ in range(2)]
            assert [a.headers["x-cache"] for a in answers] == ["miss", "exact"]
            _set(admin, cache_ttl_seconds=1)
            time.sleep(1.2)
            assert _complete(client, "Three, four,").headers["x-cache"] == "miss"  # expired
            _set(admin, cache_ttl_seconds=None)

            # request_timeout_seconds: the gateway reads it for each request
            _set(admin, request_timeout_seconds=0.001)
            late = _complete(client, "Five, six,")
            assert late.status_code == 504 and "request_timeout_seconds (0.001 s)" in late.json()["error"]["message"]
            _set(admin, request_timeout_seconds=None)
            assert _complete(client, "Five, six,").status_code == 200

            # box_cost_per_hour, energy_price_per_kwh, box_power_watts: each usage report reads them
            assert "owner_cost_per_million" not in admin.get("/admin/usage").json()["totals"]
            _set(admin, box_cost_per_hour=1.0)
            first = admin.get("/admin/usage").json()["totals"]["owner_cost_per_million"]
            _set(admin, energy_price_per_kwh=100.0, box_power_watts=100000.0)
            second = admin.get("/admin/usage").json()["totals"]["owner_cost_per_million"]
            assert first > 0 and second > 10 * first  # 10 kWh an hour at 100 a kWh outweighs 1 an hour

            # budget_alert_thresholds and budget_alert_percent: each settle reads the shares
            counted = daemon.create_key("alerted")
            admin.put("/admin/quotas/key:" + counted[:12], json={"tokens_per_day": 400}).raise_for_status()
            _set(admin, budget_alert_thresholds=[1])
            with daemon.client(counted) as spender:
                assert _complete(spender, "The capital of France is").status_code == 200
                _set(admin, budget_alert_percent=2)
                assert _complete(spender, "The capital of Italy is").status_code == 200
            with sqlite3.connect(db) as conn:
                assert sorted(p for (p,) in conn.execute("SELECT percent FROM budget_alerts")) == [1.0, 2.0]
            _set(admin, budget_alert_thresholds=None, budget_alert_percent=None)

            # cache_counts_against_quota: each settle of a cache hit reads it
            reader = daemon.create_key("cached")
            admin.put("/admin/quotas/key:" + reader[:12], json={"tokens_per_day": 100_000}).raise_for_status()

            def spent() -> int:
                return admin.get("/admin/quotas/key:" + reader[:12]).json()["usage"]["tokens_per_day"]["spent"]

            with daemon.client(reader) as cached:
                assert _complete(cached, "Seven, eight,").headers["x-cache"] == "miss"
                first = spent()
                assert _complete(cached, "Seven, eight,").headers["x-cache"] == "exact"
                counted = spent()
                assert counted > first  # counted by default
                _set(admin, cache_counts_against_quota=False)
                assert _complete(cached, "Seven, eight,").headers["x-cache"] == "exact"
                assert spent() == counted

            # files_max_bytes, batch_max_lines, files_quota_bytes_per_key: each upload reads them
            _set(admin, files_max_bytes=64)
            assert _upload(client, _line()).status_code == 413
            _set(admin, files_max_bytes=None, batch_max_lines=1)
            too_long = _upload(client, _line(2))
            assert too_long.status_code == 400 and "batch_max_lines (1)" in too_long.json()["error"]["message"]
            _set(admin, batch_max_lines=None, files_quota_bytes_per_key=len(_line()) * 3 // 2)
            kept = _upload(client, _line())
            assert kept.status_code == 200, kept.text
            assert _upload(client, _line()).status_code == 413
            _set(admin, files_quota_bytes_per_key=None)

            # batch_price_factor: read when a batch starts, and priced onto its usage rows
            prices = {"input_per_m": 1000.0, "output_per_m": 3000.0, "cached_per_m": 1000.0}  # cached prompt tokens as the rest
            admin.put("/admin/prices/*", json=prices).raise_for_status()
            _set(admin, batch_price_factor=0.25)
            batch = client.post(
                "/v1/batches",
                json={"input_file_id": kept.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            )
            assert batch.status_code == 200, batch.text
            deadline = time.monotonic() + 120
            while (seen := client.get(f"/v1/batches/{batch.json()['id']}").json())["status"] not in BATCH_DONE:
                assert time.monotonic() < deadline, f"the batch did not finish: {seen}"
                time.sleep(0.2)
            assert seen["status"] == "completed", seen
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT prompt_tokens, completion_tokens, cost FROM usage WHERE batch_id = ?", (batch.json()["id"],)
            ).fetchall()
        assert len(rows) == 1
        prompt, completion, cost = rows[0]
        assert cost == pytest.approx(0.25 * (prompt * 1000 + completion * 3000) / 1e6)
    finally:
        daemon.stop()
