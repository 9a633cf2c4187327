"""SQLite access: one engine per process, pragmas on every connection, migrations at start.

WAL with ``synchronous=NORMAL`` keeps every committed transaction across a
process crash (kill -9); ``busy_timeout`` makes writers wait for each other
instead of failing, and foreign keys are enforced.

Every connection keeps a page cache of up to 2 MiB; the pool holds up to 16 of
them, and a long-running daemon reads the ledger on each in turn, so without a
cap the pages SQLite keeps grow in 2 MiB steps to 32 MiB. ``soft_heap_limit``
caps SQLite's memory for the whole process: past it, connections recycle their
own cached pages instead of allocating more.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlmodel import Session

from appliance.db.private_files import private_database

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
BUSY_TIMEOUT_MS = 10_000
SQLITE_HEAP_LIMIT_BYTES = 8 * 1024 * 1024  # all connections' page caches and statements together


def configure_connection(dbapi_conn: sqlite3.Connection) -> None:
    """The pragmas every connection to the appliance's database gets, pooled or opened by hand."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA soft_heap_limit={SQLITE_HEAP_LIMIT_BYTES}")  # process-wide
    cur.close()


def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    configure_connection(dbapi_conn)


def make_engine(db_path: Path) -> Engine:
    engine = create_engine(
        f"sqlite:///{db_path}",
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
        pool_size=8,
        max_overflow=8,
    )
    event.listen(engine, "connect", _on_connect)
    return engine


def alembic_config(db_path: Path) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    return cfg


def migrate(db_path: Path) -> None:
    """Bring the database to the newest schema (creates it when absent).

    The database and its WAL and shared-memory files are made 0600 first, new or old (:mod:`appliance.db.private_files`)."""
    private_database(db_path)
    command.upgrade(alembic_config(db_path), "head")


def session(engine: Engine) -> Session:
    return Session(engine, expire_on_commit=False)


def ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
