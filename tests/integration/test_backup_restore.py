"""appliancectl backup / restore against the running daemon (SQLite's online backup API)."""

import os
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def ctl(daemon, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "APPLIANCE_DATA_DIR": str(daemon.data_dir)}
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def models_status(daemon, key: str) -> int:
    return httpx.get(daemon.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code


def test_backup_then_restore_brings_back_keys(daemon, tmp_path):
    before = daemon.create_key("before-backup")
    result = ctl(daemon, "backup", "snapshot.db")
    assert result.returncode == 0, result.stderr
    target = daemon.data_dir / "backups" / "snapshot.db"
    assert str(target) in result.stdout
    conn = sqlite3.connect(target)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM api_keys WHERE prefix = ?", (before[:12],)).fetchone()[0] == 1
    conn.close()

    after = daemon.create_key("after-backup")
    with daemon.admin() as admin:
        admin.delete(f"/admin/keys/{before[:12]}").raise_for_status()
    assert models_status(daemon, before) == 401

    result = ctl(daemon, "restore", "--yes", "snapshot.db")  # a name in the backups folder
    assert result.returncode == 0, result.stderr
    assert models_status(daemon, before) == 200  # revocation made after the backup is undone
    assert models_status(daemon, after) == 401  # the key created after the backup is gone


def test_restore_refuses_a_file_that_is_not_a_backup(daemon, tmp_path):
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(b"not a database" * 100)
    result = ctl(daemon, "restore", "--yes", str(bogus))
    assert result.returncode != 0
    assert "not an SQLite database" in result.stderr


def test_cli_restores_a_file_outside_the_backups_folder_after_checking_it(daemon, tmp_path):
    result = ctl(daemon, "backup", "outside-source.db")
    assert result.returncode == 0, result.stderr
    outside = tmp_path / "copied-elsewhere.db"
    outside.write_bytes((daemon.data_dir / "backups" / "outside-source.db").read_bytes())
    later = daemon.create_key("after-outside-backup")
    result = ctl(daemon, "restore", "--yes", str(outside))  # the local admin socket may name any readable file
    assert result.returncode == 0, result.stderr
    assert models_status(daemon, later) == 401


def test_cli_backup_refuses_a_path_and_an_existing_name(daemon, tmp_path):
    result = ctl(daemon, "backup", str(tmp_path / "x.db"))
    assert result.returncode != 0 and "backups are kept only in" in result.stderr
    assert not (tmp_path / "x.db").exists()
    assert ctl(daemon, "backup", "once.db").returncode == 0
    result = ctl(daemon, "backup", "once.db")
    assert result.returncode != 0 and "already exists" in result.stderr


def test_restore_forgets_answers_cached_after_the_backup(daemon):
    """After a restore the response cache serves nothing the restored database does not hold (its memory is cleared)."""
    key = daemon.create_key("cache-before-backup")
    result = ctl(daemon, "backup", "cache-snapshot.db")
    assert result.returncode == 0, result.stderr
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Name one colour (restore check)."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    with daemon.client(key, timeout=300) as client:
        first = client.post("/v1/chat/completions", json=body)
        second = client.post("/v1/chat/completions", json=body)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "exact")
    time.sleep(2)  # the cache writer has stored the entry in the database that is about to be replaced
    result = ctl(daemon, "restore", "--yes", "cache-snapshot.db")
    assert result.returncode == 0, result.stderr
    with daemon.client(key, timeout=300) as client:
        third = client.post("/v1/chat/completions", json=body)
    assert third.status_code == 200, third.text
    assert third.headers["x-cache"] == "miss"
