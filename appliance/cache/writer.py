"""The cache's one writer thread: group commit of stores, hit counts, evictions, expiry and purges.

Everything queued since the last batch is committed in one transaction, with the
hit counts gathered meanwhile; then rows above ``cache_max_entries`` are evicted,
least recently used first, and once a minute expired rows are deleted. Purges
and flushes go through the same queue, so they are ordered after every store
queued before them. The hot LRU and the semantic index follow every insert and
deletion here, which keeps the three coherent. A store acknowledges nothing to
a client: when the queue is full it is dropped, and a crash may lose queued stores.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from appliance.cache import entries
from appliance.cache.counters import CacheCounters
from appliance.cache.entries import Deleted, EntryStore
from appliance.cache.exact import HotEntries, HotEntry, PendingHits, StoredKeys
from appliance.cache.keys import Prepared
from appliance.cache.replay import complete_response, from_stream, usage_tokens
from appliance.cache.semantic_tier import SemanticTier
from appliance.jsontypes import JsonObject
from appliance.settings import Settings

log = logging.getLogger("appliance.cache.writer")

QUEUE_MAX = 10_000
BATCH_MAX = 512
EXPIRY_INTERVAL_S = 60.0
TOUCH_INTERVAL_S = 1.0
#: After the first store arrives, the writer waits this long for more before it writes: one wake-up and one
#: transaction for a burst, not one per answer taking the interpreter from the request path each time.
LINGER_S = 0.02


@dataclass(slots=True)
class _Store:
    """An answer to cache: a plain ``response``, or a stream's ``events`` and ``usage`` to fold."""

    prep: Prepared
    response: JsonObject | None = None
    events: list[bytes] = field(default_factory=list)
    usage: JsonObject | None = None


@dataclass(slots=True)
class _Row:
    """A store made ready for its row before the transaction: folded, encoded, embedded."""

    prep: Prepared
    response: JsonObject
    text: str
    vector: np.ndarray | None
    blob: bytes | None
    prompt_tokens: int
    completion_tokens: int
    size: int


@dataclass(slots=True)
class _Command:
    """``expire``, ``purge`` (of ``model`` and/or ``key_id``), ``flush`` or ``stop``; ``done`` gets the rows deleted."""

    kind: str
    done: concurrent.futures.Future[int] | None = None
    model: str | None = None
    key_id: int | None = None


class CacheWriter:
    """Owns every change to ``cache_entries`` and to the memory that mirrors it."""

    def __init__(
        self,
        settings: Settings,
        rows: EntryStore,
        hot: HotEntries,
        hits: PendingHits,
        semantic: SemanticTier | None,
        counters: CacheCounters,
        stored: StoredKeys,
    ):
        self._settings = settings
        self._stored = stored
        self._rows = rows
        self._hot = hot
        self._hits = hits
        self._semantic = semantic
        self._counters = counters
        self._queue: queue.Queue[_Store | _Command] = queue.Queue(QUEUE_MAX)
        self._count = 0
        self.recount()
        self._thread = threading.Thread(target=self._loop, name="cache-writer", daemon=True)
        self._thread.start()

    def recount(self) -> None:
        """Read the number of rows and their keys again (at start, and after a database restore)."""
        conn = self._rows.connect()
        try:
            keys = entries.keys(conn)
        finally:
            conn.close()
        self._stored.replace(keys)
        self._count = len(keys)

    # -- what callers queue ----------------------------------------------------------
    def store(self, prep: Prepared, response: JsonObject) -> None:
        self._offer(_Store(prep, response=response))

    def store_stream(self, prep: Prepared, events: list[bytes], usage: JsonObject) -> None:
        self._offer(_Store(prep, events=events, usage=usage))

    def purge(self, model: str | None, key_id: int | None) -> int:
        return self._wait(_Command("purge", model=model, key_id=key_id), 60)

    def expire_now(self) -> int:
        return self._wait(_Command("expire"), 60)

    def flush(self, timeout: float) -> None:
        self._wait(_Command("flush"), timeout)

    def stop(self) -> None:
        """Write what is queued and end the thread."""
        self._queue.put(_Command("stop"))
        self._thread.join(timeout=30)

    def _offer(self, item: _Store) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._counters.add("dropped")

    def _wait(self, command: _Command, timeout: float) -> int:
        command.done = concurrent.futures.Future()
        self._queue.put(command)
        return command.done.result(timeout=timeout)

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        conn = self._rows.connect()
        next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
        running = True
        while running:
            try:
                first = self._queue.get(timeout=min(TOUCH_INTERVAL_S, max(0.05, next_expiry - time.monotonic())))
            except queue.Empty:
                first = None
            batch = [first] if first is not None else []
            if isinstance(first, _Store):
                time.sleep(LINGER_S)
            while batch and len(batch) < BATCH_MAX:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
                    batch.append(_Command("expire"))
                running = self._write(conn, batch)
            except Exception:
                log.exception("cache writer failed; %d queued items lost", len(batch))
                for item in batch:
                    if isinstance(item, _Command) and item.done is not None and not item.done.done():
                        item.done.set_exception(RuntimeError("cache writer failed"))
                if conn.in_transaction:
                    conn.rollback()
                running = not any(isinstance(item, _Command) and item.kind == "stop" for item in batch)
        conn.close()

    def _write(self, conn: sqlite3.Connection, batch: list[_Store | _Command]) -> bool:
        """One transaction for the batch. Folding, encoding and embedding happen before it begins,
        so the database's write lock is held for the statements alone (the ledger's writes wait for it)."""
        hits = self._hits.take()
        if not batch and not hits:
            return True
        work: list[_Row | _Command] = []
        for item in batch:
            if isinstance(item, _Command):
                work.append(item)
                continue
            try:
                row = self._row(item)
            except Exception:
                log.exception("caching a response failed")
                self._hot.drop([item.prep.key])
                continue
            if row is not None:
                work.append(row)
        waiters: list[tuple[concurrent.futures.Future[int], int]] = []
        running = True
        conn.execute("BEGIN IMMEDIATE")
        try:
            for task in work:
                if isinstance(task, _Row):
                    try:
                        self._insert(conn, task)
                    except Exception:
                        log.exception("caching a response failed")
                        self._hot.drop([task.prep.key])
                elif task.kind == "expire":
                    count = self._expire(conn)
                    if task.done is not None:
                        waiters.append((task.done, count))
                elif task.kind == "purge":
                    entries.add_hits(conn, hits)
                    hits = {}
                    purged = self._purge(conn, task.model, task.key_id)
                    if task.done is not None:
                        waiters.append((task.done, purged))
                elif task.kind == "flush" and task.done is not None:
                    waiters.append((task.done, 0))
                elif task.kind == "stop":
                    running = False
            entries.add_hits(conn, hits)
            if self._count > self._settings.cache_max_entries:
                self._evict(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        for future, value in waiters:
            future.set_result(value)
        return running

    def _row(self, item: _Store) -> _Row | None:
        """The row a store becomes, or None for an answer not worth caching (unfinished, an error)."""
        prep = item.prep
        response = item.response if item.response is not None else from_stream(prep.endpoint, item.events, item.usage)
        if response is None or not complete_response(prep.endpoint, response):
            return None
        prompt_tokens, completion_tokens = usage_tokens(response)
        vector: np.ndarray | None = None
        if prep.text is not None and self._semantic is not None:
            vector = self._semantic.vector_for(prep.key, prep.text)
        text = json.dumps(response, separators=(",", ":"), ensure_ascii=False)
        blob = vector.astype(np.float32).tobytes() if vector is not None else None
        size = len(text.encode()) + (len(blob) if blob else 0) + (len(prep.text.encode()) if prep.text and blob else 0)
        return _Row(prep, response, text, vector, blob, prompt_tokens, completion_tokens, size)

    def _insert(self, conn: sqlite3.Connection, row: _Row) -> None:
        prep = row.prep
        now = time.time()
        self._stored.add(prep.key)  # before the row exists: a reader may find the key and no row, never the reverse
        entry_id, hits = entries.upsert(conn, prep, row.text, row.blob, row.prompt_tokens, row.completion_tokens, row.size, now)
        if hits == 0:
            self._count += 1
        self._hot.put(
            prep.key,
            HotEntry(
                entry_id,
                prep.endpoint,
                prep.model,
                prep.key_id,
                row.response,
                row.prompt_tokens,
                row.completion_tokens,
                now,
                len(row.text),
            ),
        )
        if self._semantic is not None:
            if row.vector is not None and prep.scope is not None:
                self._semantic.index.add(prep.scope, entry_id, row.vector, prep.text or "")
            else:
                self._semantic.index.remove([entry_id])
        self._counters.add("stores")

    def _deleted(self, rows: Deleted, counter: str) -> int:
        if not rows:
            return 0
        self._hot.drop(key for _, key in rows)
        self._stored.discard(key for _, key in rows)
        if self._semantic is not None:
            self._semantic.index.remove(r[0] for r in rows)
        self._count = max(0, self._count - len(rows))
        self._counters.add(counter, len(rows))
        return len(rows)

    def _evict(self, conn: sqlite3.Connection) -> None:
        self._count = entries.count(conn)
        cap = self._settings.cache_max_entries
        excess = self._count - cap
        if excess <= 0:
            return
        excess += cap // 100  # evict a little more, so a full cache does not evict on every store
        self._deleted(entries.delete_least_recent(conn, excess), "evicted")

    def _expire(self, conn: sqlite3.Connection) -> int:
        ttl = self._settings.cache_ttl_seconds
        if not ttl:
            return 0
        return self._deleted(entries.delete_created_before(conn, time.time() - ttl), "expired")

    def _purge(self, conn: sqlite3.Connection, model: str | None, key_id: int | None) -> int:
        rows = entries.delete_matching(conn, model, key_id)
        if model is None and key_id is None:
            self._hot.clear()
            if self._semantic is not None:
                self._semantic.index.clear()
        return self._deleted(rows, "purged")
