"""appliancectl backup / restore against the running daemon (SQLite's online backup API)."""

import os
import sqlite3
import subprocess
import sys

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
    target = tmp_path / "snapshot.db"
    result = ctl(daemon, "backup", str(target))
    assert result.returncode == 0, result.stderr
    conn = sqlite3.connect(target)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM api_keys WHERE prefix = ?", (before[:12],)).fetchone()[0] == 1
    conn.close()

    after = daemon.create_key("after-backup")
    with daemon.admin() as admin:
        admin.delete(f"/admin/keys/{before[:12]}").raise_for_status()
    assert models_status(daemon, before) == 401

    result = ctl(daemon, "restore", "--yes", str(target))
    assert result.returncode == 0, result.stderr
    assert models_status(daemon, before) == 200  # revocation made after the backup is undone
    assert models_status(daemon, after) == 401  # the key created after the backup is gone


def test_restore_refuses_a_file_that_is_not_a_backup(daemon, tmp_path):
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(b"not a database" * 100)
    result = ctl(daemon, "restore", "--yes", str(bogus))
    assert result.returncode != 0
    assert "not an SQLite database" in result.stderr


def test_backup_path_must_be_a_file_in_an_existing_folder(daemon, tmp_path):
    result = ctl(daemon, "backup", str(tmp_path / "missing" / "x.db"))
    assert result.returncode != 0 and "does not exist" in result.stderr
