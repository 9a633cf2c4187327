"""Upgrade in place: re-running the installer on a data dir made by an earlier schema migrates it forward."""

import hashlib
import os
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from alembic import command
from alembic.script import ScriptDirectory

from appliance.db.engine import alembic_config
from tests.daemon import RunningDaemon, daemon_env, free_port

pytestmark = pytest.mark.slow
OLD_KEY = "ak_" + "o" * 40


def _installer(data_dir, port):
    env = daemon_env(data_dir, port)
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", "install", "--local", "--no-serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_install_migrates_an_older_database_and_keeps_its_data(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir).mkdir()
    db = data_dir / "appliance.db"
    command.upgrade(alembic_config(db), "0001")  # the first released schema
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO api_keys (name, prefix, secret_hash, role, priority, created_at) VALUES (?, ?, ?, 'user', 'interactive', ?)",
        ("from-v1", OLD_KEY[:12], hashlib.sha256(OLD_KEY.encode()).hexdigest(), time.time()),
    )
    conn.execute(
        "INSERT INTO usage (request_id, created_at, endpoint, model, prompt_tokens, completion_tokens, cached_tokens, status, "
        "cache_tier, cost)"
        " VALUES ('req_old', ?, 'chat', 'gemma-3-270m:q4_k_m', 7, 5, 0, 200, 'miss', 0.0)",
        (time.time(),),
    )
    conn.commit()
    conn.close()

    port = free_port()
    first = _installer(data_dir, port)
    assert first.returncode == 0, first.stderr
    head = ScriptDirectory.from_config(alembic_config(db)).get_current_head()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head != "0001"
    assert conn.execute("SELECT count(*) FROM api_keys WHERE name = 'from-v1'").fetchone()[0] == 1
    assert conn.execute("SELECT prompt_tokens FROM usage WHERE request_id = 'req_old'").fetchone()[0] == 7
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "ix_usage_team_created" in indexes
    conn.close()
    assert "one-time password" in first.stdout

    again = _installer(data_dir, port)  # idempotent; the admin (not yet signed in) is shown the same one-time password
    assert again.returncode == 0, again.stderr
    assert first.stdout.split("one-time password ")[1].split()[0] in again.stdout

    daemon = RunningDaemon(data_dir, port, daemon_env(data_dir, port)).start()
    try:
        response = httpx.get(daemon.url + "/v1/models", headers={"Authorization": f"Bearer {OLD_KEY}"})
        assert response.status_code == 200
    finally:
        daemon.stop()


def test_upgrade_command_migrates_forward(tmp_path):
    db = tmp_path / "appliance.db"
    command.upgrade(alembic_config(db), "0001")
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env["APPLIANCE_DATA_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "upgrade"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    head = ScriptDirectory.from_config(alembic_config(db)).get_current_head()
    assert sqlite3.connect(db).execute("SELECT version_num FROM alembic_version").fetchone()[0] == head
