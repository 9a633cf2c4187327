"""What an upgrade from a bundle does to the database: the schema revision it reads, the backup, the byte-exact restore."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic.script import ScriptDirectory

from appliance.cli.upgrade import back_up, db_revision, restore_copy
from appliance.db.engine import alembic_config, migrate
from appliance.settings import Settings


def _rows(db: Path) -> list[tuple[str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT key FROM kv ORDER BY key").fetchall()


def test_the_revision_is_the_newest_migration_or_none(tmp_path: Path) -> None:
    assert db_revision(tmp_path / "absent.db") is None
    sqlite3.connect(tmp_path / "plain.db").execute("CREATE TABLE t (x)").connection.close()
    assert db_revision(tmp_path / "plain.db") is None
    migrate(tmp_path / "appliance.db")
    assert db_revision(tmp_path / "appliance.db") == ScriptDirectory.from_config(alembic_config(tmp_path)).get_current_head()


def test_a_restored_backup_undoes_a_migration_and_the_rows_written_after_it(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    migrate(settings.db_path)
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("INSERT INTO kv (key, value) VALUES ('before', '1')")
    before = db_revision(settings.db_path)
    saved = back_up(settings, "pre-upgrade-test.db")
    assert saved.parent == tmp_path / "backups" and oct(saved.stat().st_mode & 0o777) == "0o600"
    with sqlite3.connect(settings.db_path) as conn:  # what a newer release's migration and first minutes would do
        conn.execute("CREATE TABLE upgrade_probe (id INTEGER PRIMARY KEY)")
        conn.execute("UPDATE alembic_version SET version_num = '9901'")
        conn.execute("INSERT INTO kv (key, value) VALUES ('after', '2')")
    restore_copy(settings, saved)
    assert db_revision(settings.db_path) == before
    assert _rows(settings.db_path) == [("before",)]
    with sqlite3.connect(settings.db_path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'upgrade_probe'").fetchall() == []
