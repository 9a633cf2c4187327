"""The cache's rows in SQLite: connections, the reads of the lookup paths, and the writer's statements.

Reads run on a connection per thread (the event loop's, the embedding thread's,
the writer's). The statements that change ``cache_entries`` take the writer's
connection inside its transaction, and return the ``(id, cache_key)`` of the
rows they delete so that memory can follow.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time

from sqlalchemy import Engine

from appliance.cache.exact import HotEntry, expired
from appliance.cache.keys import Prepared
from appliance.db.engine import configure_connection
from appliance.settings import Settings

_COLUMNS = "id, endpoint, model, key_id, response, prompt_tokens, completion_tokens, created_at, cache_key"
_UPSERT = """INSERT INTO cache_entries (cache_key, scope_key, model, key_id, endpoint, prompt_text, response, prompt_tokens,
                   completion_tokens, embedding, created_at, last_hit_at, hits, size_bytes)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)
               ON CONFLICT(cache_key) DO UPDATE SET scope_key = excluded.scope_key, prompt_text = excluded.prompt_text,
                   response = excluded.response, prompt_tokens = excluded.prompt_tokens,
                   completion_tokens = excluded.completion_tokens, embedding = excluded.embedding,
                   created_at = excluded.created_at, last_hit_at = excluded.last_hit_at, size_bytes = excluded.size_bytes
               RETURNING id, hits"""

#: Deleted rows, as ``(id, cache_key)``.
Deleted = list[tuple[int, str]]


class EntryStore:
    """The database file behind ``db_engine``, as the response cache reads it."""

    def __init__(self, settings: Settings, db_engine: Engine):
        path = db_engine.url.database
        if not path or path == ":memory:":
            raise ValueError("the response cache needs a file database")
        self._settings = settings
        self._path = path
        self._local = threading.local()

    def connect(self) -> sqlite3.Connection:
        """A new connection in autocommit mode (the caller closes it)."""
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=10.0)
        configure_connection(conn)  # the pragmas of every connection to the database
        return conn

    def reader(self) -> sqlite3.Connection:
        """This thread's connection for reads."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connect()
        return conn

    def by_key(self, key: str, now: float) -> HotEntry | None:
        """The unexpired entry stored under ``key``."""
        found = self._fresh("cache_key", key, now)
        return found[1] if found else None

    def by_id(self, entry_id: int, now: float) -> tuple[str, HotEntry] | None:
        """The cache key and entry of the unexpired row ``entry_id``."""
        return self._fresh("id", entry_id, now)

    def _fresh(self, column: str, value: str | int, now: float) -> tuple[str, HotEntry] | None:
        row = self.reader().execute(f"SELECT {_COLUMNS} FROM cache_entries WHERE {column} = ?", (value,)).fetchone()
        if row is None or expired(row[7], self._settings.cache_ttl_seconds, now):
            return None
        return row[8], HotEntry(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6], row[7], len(row[4]))

    def scope_rows(self, scope: str) -> list[tuple[int, bytes, str]]:
        """``(id, embedding, prompt text)`` of the unexpired rows of a semantic scope."""
        now = time.time()
        ttl = self._settings.cache_ttl_seconds
        rows = (
            self.reader()
            .execute(
                "SELECT id, embedding, prompt_text, created_at FROM cache_entries WHERE scope_key = ? AND embedding IS NOT NULL",
                (scope,),
            )
            .fetchall()
        )
        return [(r[0], r[1], r[2]) for r in rows if not expired(r[3], ttl, now)]

    def totals(self) -> tuple[int, int, int]:
        """(entries, bytes, recorded hits), on a connection of its own: callers run on any worker thread."""
        conn = self.connect()
        try:
            return conn.execute(
                "SELECT count(*), coalesce(sum(size_bytes), 0), coalesce(sum(hits), 0) FROM cache_entries"
            ).fetchone()
        finally:
            conn.close()


def count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM cache_entries").fetchone()[0]


def keys(conn: sqlite3.Connection) -> list[str]:
    """Every stored cache key."""
    return [k for (k,) in conn.execute("SELECT cache_key FROM cache_entries")]


def upsert(
    conn: sqlite3.Connection,
    prep: Prepared,
    response: str,
    embedding: bytes | None,
    prompt_tokens: int,
    completion_tokens: int,
    size: int,
    now: float,
) -> tuple[int, int]:
    """Insert or replace the row of ``prep.key``; returns its id and hits (0 for a new row)."""
    return conn.execute(
        _UPSERT,
        (
            prep.key,
            prep.scope or "",
            prep.model,
            prep.key_id,
            prep.endpoint,
            prep.text if embedding else None,
            response,
            prompt_tokens,
            completion_tokens,
            embedding,
            now,
            now,
            size,
        ),
    ).fetchone()


def add_hits(conn: sqlite3.Connection, hits: dict[str, tuple[float, int]]) -> None:
    """Fold counted hits (cache key -> (latest hit time, count)) into the rows."""
    if hits:
        conn.executemany(
            "UPDATE cache_entries SET hits = hits + ?, last_hit_at = max(last_hit_at, ?) WHERE cache_key = ?",
            [(n, when, key) for key, (when, n) in hits.items()],
        )


def delete_least_recent(conn: sqlite3.Connection, n: int) -> Deleted:
    return conn.execute(
        "DELETE FROM cache_entries WHERE id IN (SELECT id FROM cache_entries ORDER BY last_hit_at, id LIMIT ?) RETURNING id, "
        "cache_key",
        (n,),
    ).fetchall()


def delete_created_before(conn: sqlite3.Connection, before: float) -> Deleted:
    return conn.execute("DELETE FROM cache_entries WHERE created_at <= ? RETURNING id, cache_key", (before,)).fetchall()


def delete_matching(conn: sqlite3.Connection, model: str | None, key_id: int | None) -> Deleted:
    """Delete the rows of a model (a family name: all its variants), of a key, of both, or (neither given) all."""
    where: list[str] = []
    args: list[str | int] = []
    if model is not None:
        if ":" in model:
            where.append("model = ?")
            args.append(model)
        else:
            where.append("(model = ? OR model LIKE ? ESCAPE '\\')")
            args += [model, model.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"]
    if key_id is not None:
        where.append("key_id = ?")
        args.append(key_id)
    sql = "DELETE FROM cache_entries" + (" WHERE " + " AND ".join(where) if where else "") + " RETURNING id, cache_key"
    return conn.execute(sql, args).fetchall()
