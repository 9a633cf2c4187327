"""Settings changed at runtime: when each applies, validation through the model, the comment-keeping
atomic write of the config file, refusals of settings the environment sets, and masked secrets."""

from __future__ import annotations

import os
import stat

import pytest
from sqlalchemy import select

from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import AuditLog
from appliance.errors import BadRequest, Conflict
from appliance.settings import Settings, load_settings
from appliance.settings.applies import APPLIES, applies
from appliance.settings.config_writer import REMOVE, edited_text, write_changes
from appliance.settings.editor import plan_change, shown
from appliance.settings.runtime import RuntimeSettings
from tests.meterkit import new_db

CONFIG = """# Appliance settings, kept by hand
currency = "EUR"  # what prices are written in

# listener
port = 8080

[latency_targets.batch]
ttft_p95_s = 20.0  # overnight work
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "appliance.toml"
    path.write_text(CONFIG)
    path.chmod(0o640)
    for name in list(os.environ):
        if name.startswith("APPLIANCE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("APPLIANCE_CONFIG", str(path))
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "data"))
    return path


@pytest.fixture
def audit(tmp_path):
    engine = new_db(tmp_path / "audit.db")
    yield AuditTrail(engine), engine
    engine.dispose()


def _audit_rows(engine):
    with session(engine) as s:
        return [(r.action, r.target, r.detail) for r in s.execute(select(AuditLog).order_by(AuditLog.id)).scalars()]


def test_every_setting_is_classified_and_only_proved_ones_are_live():
    assert set(Settings.model_fields) - set(APPLIES) == set(), "a setting without a decision: add it to APPLIES"
    assert set(APPLIES) - set(Settings.model_fields) == set(), "a decision for a setting that does not exist"
    # each of these is changed on a running daemon and seen used at once in tests/integration/test_runtime_settings_daemon.py
    assert {name for name, when in APPLIES.items() if when == "live"} == {
        "log_level",
        "default_model",
        "request_timeout_seconds",
        "currency",
        "cache_enabled",
        "cache_ttl_seconds",
        "cache_counts_against_quota",
        "request_log_days",
        "request_log_max_rows",
        "metrics_public",
        "files_max_bytes",
        "files_quota_bytes_per_key",
        "batch_max_lines",
        "batch_price_factor",
        "box_cost_per_hour",
        "energy_price_per_kwh",
        "box_power_watts",
        "budget_alert_thresholds",
        "budget_alert_percent",
        "alert_webhook_url",
        "alert_webhook_secret",
    }
    assert applies("port") == "restart" and applies("oidc_issuer") == "restart" and applies("currency") == "live"


def test_a_change_is_validated_with_the_whole_model(config):
    settings = load_settings()
    plan = plan_change(settings, {"currency": "GBP", "port": 9090, "default_model": None})
    by_name = {c.name: c for c in plan.changes}
    assert (by_name["currency"].before, by_name["currency"].after, by_name["currency"].applies) == ("EUR", "GBP", "live")
    assert (by_name["port"].after, by_name["port"].applies) == (9090, "restart")
    assert by_name["default_model"].file_value is REMOVE  # null: back to the default, out of the file
    with pytest.raises(BadRequest) as bad:
        plan_change(settings, {"port": 70000})
    assert bad.value.param == "port" and "65535" in bad.value.message
    with pytest.raises(BadRequest) as bad:
        plan_change(settings, {"alert_webhook_url": "https://hooks.example/x"})  # a rule between two settings
    assert bad.value.param == "alert_webhook_url" and "alert_webhook_secret" in bad.value.message
    with pytest.raises(BadRequest) as bad:
        plan_change(settings, {"vllm_python": "/bin/sh"})  # a program the daemon would run: the file on the box only
    assert bad.value.param == "vllm_python" and "config file on the box" in bad.value.message
    with pytest.raises(BadRequest) as bad:
        plan_change(settings, {"no_such_setting": 1})
    assert bad.value.param == "no_such_setting"


def test_a_setting_the_environment_sets_is_refused(config, monkeypatch):
    monkeypatch.setenv("APPLIANCE_CURRENCY", "CHF")
    settings = load_settings()
    with pytest.raises(Conflict) as refused:
        plan_change(settings, {"currency": "EUR"})
    assert refused.value.param == "currency" and "APPLIANCE_CURRENCY" in refused.value.message


def test_the_write_keeps_comments_order_and_tables():
    text = edited_text(CONFIG, {"currency": "USD", "port": REMOVE, "queue_size": 32})
    assert text.startswith('# Appliance settings, kept by hand\ncurrency = "USD"  # what prices are written in\n')
    assert "port" not in text and "# listener" in text
    assert "ttft_p95_s = 20.0  # overnight work" in text
    assert text.index("queue_size = 32") < text.index("[latency_targets.batch]")


def test_the_file_is_replaced_atomically_with_its_mode(config):
    before = config.stat()
    write_changes(config, {"currency": "USD"})
    after = config.stat()
    assert after.st_ino != before.st_ino  # a new file renamed over the old one
    assert stat.S_IMODE(after.st_mode) == 0o640 and (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert 'currency = "USD"  # what prices are written in' in config.read_text()
    assert [p.name for p in config.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_secrets_are_masked_in_answers_and_in_the_audit(config, audit):
    trail, engine = audit
    settings = load_settings()
    runtime = RuntimeSettings(settings, trail, config)
    runtime.change("user:root", {"alert_webhook_url": "https://hooks.example/a", "alert_webhook_secret": "s3cret-value"})
    assert settings.alert_webhook_secret == "s3cret-value"  # live: the running object has it
    rows = {r["name"]: r for r in runtime.rows()}
    assert rows["alert_webhook_secret"]["value"] == "(set)"
    assert rows["alert_webhook_url"]["source"] == "config file"
    details = " ".join(d or "" for _, _, d in _audit_rows(engine))
    assert "s3cret-value" not in details and "'(not set)' -> '(set)' (live)" in details
    assert "s3cret-value" in config.read_text()  # the file is the source of truth
    assert shown("hub_url", "https://user:pw@hub.example/") == "https://(redacted)@hub.example/"


def test_a_restart_setting_is_written_and_pending_not_applied(config, audit):
    trail, engine = audit
    settings = load_settings()
    changed = []
    runtime = RuntimeSettings(settings, trail, config, after_live_change=changed.append)
    runtime.change("user:root", {"port": 9191, "currency": "JPY"})
    assert settings.port == 8080 and settings.currency == "JPY"
    assert runtime.pending() == {"port": 9191} and changed == [{"currency"}]
    assert {r["name"]: r["pending_restart"] for r in runtime.rows()}["port"] is True
    assert load_settings().port == 9191  # what the next start reads
    assert ("settings.change", "port", "8080 -> 9191 (restart)") in _audit_rows(engine)
    runtime.change("user:root", {"port": 8080})
    assert runtime.pending() == {}


def test_a_refused_change_writes_and_applies_nothing(config, audit):
    trail, engine = audit
    settings = load_settings()
    runtime = RuntimeSettings(settings, trail, config)
    with pytest.raises(BadRequest):
        runtime.change("user:root", {"currency": "GBP", "port": 0})
    assert config.read_text() == CONFIG and settings.currency == "EUR" and _audit_rows(engine) == []


def test_without_a_config_file_a_change_is_refused(tmp_path, audit, monkeypatch):
    trail, _ = audit
    monkeypatch.delenv("APPLIANCE_CONFIG", raising=False)
    runtime = RuntimeSettings(load_settings(data_dir=tmp_path), trail, None)
    with pytest.raises(Conflict) as refused:
        runtime.change("user:root", {"currency": "GBP"})
    assert "APPLIANCE_CONFIG" in refused.value.message
