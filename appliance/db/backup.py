"""Online backup and restore of the database through SQLite's backup API.

Backups live only in ``<data dir>/backups`` (mode 0700), each a plain file
name, created exclusively (an existing file is never replaced) with mode 0600:
they hold key and password hashes. The API names a backup by ``name``; no
request can make the daemon write anywhere else.

A restore never trusts its file. It copies it to a private folder and checks
the copy before the live database is touched: SQLite's quick and full
integrity checks, then the exact schema (tables, columns, indexes, foreign
keys) that our migrations produce at the revision the copy records in
``alembic_version``, with nothing else in ``sqlite_master`` (no triggers, no
views, no virtual tables, no extra tables or indexes). The checked copy is
migrated forward to the newest revision and checked again, and only then
copied into the live database with SQLite's backup API, in one step under
SQLite's locking, so readers see either the old or the new database. A file
that fails any check leaves the live database as it was.
Backups never include model files (they are re-verifiable by sha256).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from pathlib import Path

from appliance.errors import BadRequest, Conflict, NotFound
from appliance.jsontypes import JsonObject

KEEP_SCHEDULED = 7
BACKUPS_DIRNAME = "backups"
NAME_MAX = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_restore_lock = threading.Lock()


# ---------------------------------------------------------------- the backups folder and names
def backups_dir(data_dir: Path) -> Path:
    """``<data dir>/backups``, created 0700 (and set back to 0700) when needed; never a symlink."""
    folder = Path(data_dir) / BACKUPS_DIRNAME
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise Conflict(f"{folder} is not a folder (a symlink or a file is in its place); backups are refused until it is")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)
    return folder


def check_name(name: str, param: str = "name") -> str:
    """A backup name is a plain file name: letters, digits, '.', '_', '-', not starting with '.', at most 128."""
    if not isinstance(name, str) or not name:
        raise BadRequest("the backup name is empty", param=param)
    if len(name) > NAME_MAX:
        raise BadRequest(f"the backup name is longer than {NAME_MAX} characters", param=param)
    if not _NAME.fullmatch(name) or ".." in name:
        raise BadRequest(
            "a backup name is a plain file name inside the backups folder: letters, digits, '.', '_' "
            "and '-', not starting with '.', without '..' or path separators",
            param=param,
        )
    return name


def name_from_path(path: str, folder: Path) -> str:
    """The backup name that ``path`` stands for, if it names a file directly inside ``folder``; else 400."""
    if not isinstance(path, str) or "\x00" in path:
        raise BadRequest("the backup path is not a valid path", param="path")
    candidate = Path(path)
    if not candidate.is_absolute() or candidate.parent.resolve() != folder.resolve() or candidate.name in ("", ".", ".."):
        raise BadRequest(
            f"backups are kept only in {folder}: pass a plain file name as `name` "
            f"(a `path` is accepted only when it names a file directly in that folder)",
            param="path",
        )
    return check_name(candidate.name, param="path")


def default_name(prefix: str = "backup") -> str:
    return time.strftime(f"{prefix}-%Y%m%d-%H%M%S", time.gmtime()) + f"-{secrets.token_hex(3)}.db"


# ---------------------------------------------------------------- backup
def backup(db_path: Path, folder: Path, name: str | None = None) -> JsonObject:
    """Write a consistent copy of the live database to ``folder/name``; never replaces a file."""
    name = check_name(name) if name is not None else default_name()
    target = folder / name
    if os.path.lexists(target):  # an early, friendly answer; the link below is what guarantees it
        raise Conflict(f"a backup named {name!r} already exists; choose another name", param="name")
    started = time.monotonic()
    fd, partial_name = tempfile.mkstemp(prefix=".partial-", suffix=".db", dir=folder)  # O_EXCL, mode 0600
    os.close(fd)
    partial = Path(partial_name)
    try:
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
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.link(partial, target)  # fails if the name exists, whoever created it meanwhile
        except FileExistsError:
            raise Conflict(f"a backup named {name!r} already exists; choose another name", param="name") from None
    finally:
        partial.unlink(missing_ok=True)
    return {"name": name, "path": str(target), "bytes": target.stat().st_size, "seconds": round(time.monotonic() - started, 3)}


def scheduled_backup(db_path: Path, backup_dir: Path) -> Path:
    """Daily job: a dated backup in the backups folder, keeping the newest few scheduled ones."""
    folder = backups_dir(backup_dir.parent) if backup_dir.name == BACKUPS_DIRNAME else backup_dir
    result = backup(db_path, folder, time.strftime("appliance-%Y%m%d-%H%M%S.db", time.gmtime()))
    for old in sorted(folder.glob("appliance-*.db"))[:-KEEP_SCHEDULED]:
        old.unlink(missing_ok=True)
    return Path(result["path"])


# ---------------------------------------------------------------- the expected schema
def _schema(conn: sqlite3.Connection) -> JsonObject:
    """Everything about a database's schema that a restore must match exactly."""
    objects = sorted(conn.execute("SELECT type, name, tbl_name FROM sqlite_master").fetchall())
    tables: JsonObject = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall():
        q = name.replace('"', '""')
        columns = [(r[1], (r[2] or "").upper(), r[3], r[5], r[6]) for r in conn.execute(f'PRAGMA table_xinfo("{q}")')]
        indexes = []
        for r in conn.execute(f'PRAGMA index_list("{q}")').fetchall():
            iq = r[1].replace('"', '""')
            keys = [(c[2], c[3], c[4]) for c in conn.execute(f'PRAGMA index_xinfo("{iq}")') if c[5]]
            indexes.append((r[1], r[2], r[3], r[4], tuple(keys)))
        fks = sorted((r[2], r[3], r[4], r[5], r[6]) for r in conn.execute(f'PRAGMA foreign_key_list("{q}")'))
        tables[name] = {"columns": columns, "indexes": sorted(indexes), "foreign_keys": fks}
    return {"objects": objects, "tables": tables}


@functools.lru_cache(maxsize=1)
def expected_schemas() -> tuple[dict[str, JsonObject], str]:
    """The schema our migrations produce at each known revision (built once per process), and the head."""
    from alembic import command
    from alembic.script import ScriptDirectory

    from appliance.db.engine import alembic_config

    with tempfile.TemporaryDirectory(prefix="appliance-schema-") as tmp:
        path = Path(tmp) / "schema.db"
        script = ScriptDirectory.from_config(alembic_config(path))
        head = script.get_current_head()
        schemas: dict[str, JsonObject] = {}
        for rev in reversed(list(script.walk_revisions())):
            command.upgrade(alembic_config(path), rev.revision)
            conn = sqlite3.connect(path)
            try:
                schemas[rev.revision] = _schema(conn)
            finally:
                conn.close()
    assert head is not None
    return schemas, head


def _differences(got: JsonObject, want: JsonObject) -> list[str]:
    out = []
    got_names = {(t, n) for t, n, _ in got["objects"]}
    want_names = {(t, n) for t, n, _ in want["objects"]}
    out += [f"unexpected {t} {n!r}" for t, n in sorted(got_names - want_names)]
    out += [f"missing {t} {n!r}" for t, n in sorted(want_names - got_names)]
    for table in sorted(set(got["tables"]) & set(want["tables"])):
        for part in ("columns", "indexes", "foreign_keys"):
            if got["tables"][table][part] != want["tables"][table][part]:
                out.append(f"table {table!r} has other {part.replace('_', ' ')}")
    if not out and got != want:
        out.append("the schema objects differ")
    return out


# ---------------------------------------------------------------- restore
def restore_source(folder: Path, *, name: str | None, path: str | None, local: bool) -> tuple[Path, bool]:
    """The file a restore request names, and whether it must be a backup in ``folder``.

    A name is always a file in the backups folder. A path from the local admin socket may be any
    readable file; from anywhere else it must name a file directly in the backups folder."""
    if (name is None) == (path is None):
        raise BadRequest(
            "name the backup to restore: `name` (a file in the backups folder) or, from the local admin socket, `path`",
            param="name",
        )
    if name is not None:
        return folder / check_name(name), True
    assert path is not None
    if local:
        if "\x00" in path or not Path(path).is_absolute():
            raise BadRequest("the backup path must be absolute", param="path")
        return Path(path), False
    return folder / name_from_path(path, folder), True


def _private_copy(source: Path, dest: Path, in_backups: bool) -> None:
    """Copy a regular file's bytes (never a device, FIFO or, in the backups folder, a symlink)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if in_backups else 0)
    try:
        fd = os.open(source, flags)
    except FileNotFoundError:
        raise NotFound(f"no backup file at {source}", param="path") from None
    except OSError as e:
        raise BadRequest(f"cannot open the backup file {source}: {e.strerror}", param="path") from None
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise BadRequest(f"{source} is not a regular file", param="path")
        if src.read(16) != _SQLITE_MAGIC:
            raise BadRequest("that file is not an SQLite database", param="path")
        src.seek(0)
        with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)


def _verify(path: Path, page_size: int | None = None) -> str:
    """Check a private copy; returns its recorded revision. Raises BadRequest on anything unexpected."""
    schemas, _head = expected_schemas()
    try:
        conn = sqlite3.connect(f"file:{path}", uri=True, isolation_level=None)
    except sqlite3.DatabaseError as e:
        raise BadRequest(f"the backup cannot be opened by SQLite: {e}", param="path") from None
    try:
        conn.execute("PRAGMA trusted_schema=OFF")
        try:
            quick = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if quick != "ok":  # fails fast on a corrupt page, before the slower full check
                raise BadRequest(f"the backup fails SQLite's integrity check (quick_check: {quick[:200]})", param="path")
            problems = [r[0] for r in conn.execute("PRAGMA integrity_check(5)")]
            if problems != ["ok"]:
                raise BadRequest("the backup fails SQLite's integrity check: " + "; ".join(problems)[:300], param="path")
            rows = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
        except sqlite3.DatabaseError as e:
            raise BadRequest(f"the backup is corrupt or not an appliance database: {e}", param="path") from None
        for kind in ("trigger", "view"):
            found = sorted(n for t, n, _ in rows if t == kind)
            if found:
                raise BadRequest(
                    f"the backup defines {kind}s ({', '.join(found)[:200]}); appliance backups have none", param="path"
                )
        virtual = sorted(n for t, n, sql in rows if t == "table" and (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"))
        if virtual:
            raise BadRequest(
                f"the backup defines virtual tables ({', '.join(virtual)[:200]}); appliance backups have none", param="path"
            )
        other = sorted(f"{t} {n}" for t, n, _ in rows if t not in ("table", "index"))
        if other:
            raise BadRequest(f"the backup holds unexpected schema objects ({', '.join(other)[:200]})", param="path")
        if "alembic_version" not in {n for t, n, _ in rows if t == "table"}:
            raise BadRequest("that database is not an appliance backup (no alembic_version table)", param="path")
        try:
            versions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
        except sqlite3.DatabaseError as e:
            raise BadRequest(f"that database is not an appliance backup: {e}", param="path") from None
        if len(versions) != 1 or versions[0] not in schemas:
            raise BadRequest(
                f"the backup records an unknown schema revision {versions!r:.100}; known: {', '.join(schemas)}", param="path"
            )
        revision = versions[0]
        try:
            got = _schema(conn)
        except sqlite3.DatabaseError as e:
            raise BadRequest(f"the backup's schema cannot be read: {e}", param="path") from None
        differences = _differences(got, schemas[revision])
        if differences:
            raise BadRequest(
                f"the backup's schema is not the appliance's schema at revision {revision}: " + "; ".join(differences[:8])[:400],
                param="path",
            )
        conn.execute("PRAGMA journal_mode=DELETE")
        if page_size is not None and conn.execute("PRAGMA page_size").fetchone()[0] != page_size:
            conn.execute(f"PRAGMA page_size={int(page_size)}")
            conn.execute("VACUUM")  # the backup API cannot change a WAL database's page size
        return revision
    finally:
        conn.close()


def restore(db_path: Path, source: Path, *, in_backups: bool) -> JsonObject:
    """Replace the live database's contents with a verified, migrated copy of ``source``."""
    from appliance.db.engine import migrate

    _schemas, head = expected_schemas()
    started = time.monotonic()
    with _restore_lock:
        live = sqlite3.connect(db_path, timeout=30)
        try:
            page_size = live.execute("PRAGMA page_size").fetchone()[0]
        finally:
            live.close()
        work = Path(tempfile.mkdtemp(prefix=".restore-", dir=Path(db_path).parent))  # mode 0700
        try:
            copy = work / "restore.db"
            _private_copy(source, copy, in_backups)
            revision = _verify(copy, page_size)
            if revision != head:
                migrate(copy)
                _verify(copy, page_size)
            verified = sqlite3.connect(copy)
            try:
                dest = sqlite3.connect(db_path, timeout=30)
                try:
                    verified.backup(dest)  # one step: a single write transaction on the live database
                finally:
                    dest.close()
            finally:
                verified.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return {"path": str(source), "revision": revision, "migrated_to": head, "seconds": round(time.monotonic() - started, 3)}
