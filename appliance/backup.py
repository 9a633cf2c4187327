"""Online backup and restore of the database through SQLite's backup API.

Both run while the daemon serves: the backup API copies a consistent snapshot
page by page, and a restore copies the backup into the live database under
SQLite's own locking, then migrates it forward if it came from an older
schema. Backups never include model files (they are re-verifiable by sha256).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from appliance.errors import BadRequest

KEEP_SCHEDULED = 7


def _check_target(path: Path) -> Path:
    if not path.is_absolute():
        raise BadRequest("the backup path must be absolute", param="path")
    if path.exists() and path.is_dir():
        raise BadRequest("the backup path is a folder; name a file", param="path")
    if not path.parent.is_dir():
        raise BadRequest("the backup path's folder does not exist", param="path")
    return path


def backup(db_path: Path, target: Path) -> dict:
    """Write a consistent copy of the live database to ``target`` (atomically)."""
    target = _check_target(target)
    partial = target.with_name(target.name + ".partial")
    started = time.monotonic()
    source = sqlite3.connect(db_path, timeout=30)
    try:
        dest = sqlite3.connect(partial)
        try:
            source.backup(dest, pages=1024, sleep=0.001)
            dest.execute("PRAGMA journal_mode=DELETE")
        finally:
            dest.close()
    finally:
        source.close()
    partial.replace(target)
    return {"path": str(target), "bytes": target.stat().st_size, "seconds": round(time.monotonic() - started, 3)}


def _validate(path: Path) -> None:
    if not path.is_file():
        raise BadRequest("no backup file at that path", param="path")
    with path.open("rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise BadRequest("that file is not an SQLite database", param="path")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if conn.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
            raise BadRequest("the backup fails SQLite's integrity check", param="path")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"api_keys", "usage", "alembic_version"} <= tables:
            raise BadRequest("that database is not an appliance backup", param="path")
    finally:
        conn.close()


def restore(db_path: Path, source_path: Path) -> dict:
    """Replace the live database's contents with a backup, then migrate it forward."""
    from appliance.db import migrate

    source_path = Path(source_path)
    if not source_path.is_absolute():
        raise BadRequest("the backup path must be absolute", param="path")
    _validate(source_path)
    started = time.monotonic()
    source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
    try:
        dest = sqlite3.connect(db_path, timeout=30)
        try:
            source.backup(dest)
        finally:
            dest.close()
    finally:
        source.close()
    migrate(db_path)
    return {"path": str(source_path), "seconds": round(time.monotonic() - started, 3)}


def scheduled_backup(db_path: Path, backup_dir: Path) -> Path:
    """Daily job: a dated backup in the data dir, keeping the newest few."""
    backup_dir.mkdir(parents=True, exist_ok=True)
    target = backup_dir / time.strftime("appliance-%Y%m%d-%H%M%S.db", time.gmtime())
    backup(db_path, target)
    for old in sorted(backup_dir.glob("appliance-*.db"))[:-KEEP_SCHEDULED]:
        old.unlink(missing_ok=True)
    return target
