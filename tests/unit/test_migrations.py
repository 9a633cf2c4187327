"""Migrations: idempotent, recorded, and in step with the SQLModel tables."""

import sqlite3

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import appliance.db.tables  # noqa: F401
from appliance.db.engine import alembic_config, make_engine, migrate


def test_migrate_records_head_and_is_idempotent(tmp_path):
    db = tmp_path / "a.db"
    migrate(db)
    migrate(db)  # a restart on the same data dir
    head = ScriptDirectory.from_config(alembic_config(db)).get_current_head()
    assert sqlite3.connect(db).execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]


def test_tables_match_migrations(tmp_path):
    db = tmp_path / "b.db"
    migrate(db)
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == [], "tables.py and the migrations differ: add a migration"


def test_pragmas_on_every_connection(tmp_path):
    db = tmp_path / "c.db"
    migrate(db)
    engine = make_engine(db)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10000
