"""The response cache: exact and semantic tiers in the appliance's own SQLite.

Read path (on the event loop, before admission): the request is normalized and
hashed (``cache_keys``), then looked up in an in-memory LRU of hot entries and,
on a miss there, by one indexed SELECT on ``cache_entries.cache_key``. The
semantic tier (``lookup_async``) runs only after an exact miss, and embeds the
prompt on a worker thread.

Write path: ``store``/``store_stream`` only check policy and queue the answer
(a plain answer also goes straight into the hot LRU, so an immediate repeat
hits). One writer thread folds streams, embeds prompts, and commits everything
queued, plus the hit counts gathered since its last batch, in one transaction
(group commit), then evicts least-recently-used rows above
``cache_max_entries`` and, once a minute, expired rows. Purges go through the
same queue, so they are ordered after every store queued before them. A cache
store acknowledges nothing to a client, so a crash may lose queued stores.

The hot LRU, the semantic index and the database change only in the writer
(inserts, evictions, purges, expiry), except that lookups drop an expired hot
entry they find, which keeps the three coherent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import queue
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import msgspec
import numpy as np
from sqlalchemy import Engine

from appliance.cache.keys import (
    Policy, cache_control, cache_key, is_deterministic, merge_policy, normalized, partition, scope_key, semantic_text,
    validate_policy,
)
from appliance.cache.replay import Hit, complete_response, from_stream
from appliance.cache.semantic import MAX_TEXT_CHARS, SemanticIndex

log = logging.getLogger("appliance.cache.responses")

HOT_MAX_ENTRIES = 4096
HOT_MAX_BYTES = 64 << 20
QUEUE_MAX = 10_000
BATCH_MAX = 512
EXPIRY_INTERVAL_S = 60.0
TOUCH_INTERVAL_S = 1.0
SEMANTIC_MAX_PENDING = 4  # semantic lookups waiting for the embedding thread before new ones are skipped
POLICY_KV_PREFIX = "cache_policy:"
_MEMO_MAX = 1024
_encode = msgspec.json.encode


@dataclass(slots=True)
class _Prepared:
    endpoint: str
    model: str
    key: str
    policy: Policy
    doc: dict
    part: str
    key_id: int | None
    may_read: bool
    may_write: bool
    text: str | None = None  # for the semantic tier, when it applies
    scope: str | None = None


@dataclass(slots=True)
class _Hot:
    id: int | None  # None until the writer has committed the row
    endpoint: str
    model: str
    key_id: int | None
    response: dict
    prompt_tokens: int
    completion_tokens: int
    created_at: float
    size: int


class ResponseCache:
    """Exact and semantic response cache. See the module docstring for the read and write paths."""

    def __init__(self, settings: Any, db_engine: Engine, embedder: Any = None):
        self.settings = settings
        self.embedder = embedder
        path = db_engine.url.database
        if not path or path == ":memory:":
            raise ValueError("the response cache needs a file database")
        self._path = path
        self._local = threading.local()
        self._hot: OrderedDict[str, _Hot] = OrderedDict()
        self._hot_bytes = 0
        self._hot_lock = threading.Lock()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()  # key -> query vector of a semantic miss, reused by store
        self._memo_lock = threading.Lock()
        self.index = SemanticIndex(self._load_scope, embedder.dim) if embedder is not None else None
        self._policies: dict[str, dict | None] = {}
        self._stats = {"lookups": 0, "exact": 0, "semantic": 0, "misses": 0, "bypassed": 0, "stores": 0, "dropped": 0,
                       "evicted": 0, "expired": 0, "purged": 0, "semantic_skipped": 0}
        self._stats_lock = threading.Lock()
        self._touches: dict[str, tuple[float, int]] = {}
        self._touch_lock = threading.Lock()
        self._embed_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cache-embed")
        self._embedding_pending = 0  # changed on the event loop only
        self._queue: queue.Queue = queue.Queue(QUEUE_MAX)
        self._count = self._read().execute("SELECT count(*) FROM cache_entries").fetchone()[0]
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="cache-writer", daemon=True)
        self._writer.start()

    # ---------------------------------------------------------------- connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=10.0)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _read(self) -> sqlite3.Connection:
        """A connection per thread for reads (the event loop's, the embedder's, the writer's)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    # ---------------------------------------------------------------- policy
    def _stored_policy(self, name: str) -> dict | None:
        if name not in self._policies:
            row = self._read().execute("SELECT value FROM kv WHERE key = ?", (POLICY_KV_PREFIX + name,)).fetchone()
            try:
                self._policies[name] = json.loads(row[0]) if row else None
            except ValueError:
                self._policies[name] = None
        return self._policies[name]

    def base_policy(self) -> Policy:
        return Policy(semantic=self.embedder is not None and bool(getattr(self.settings, "semantic_cache_enabled", True)),
                      semantic_threshold=float(self.settings.semantic_cache_threshold))

    def policy_for(self, principal: Any) -> Policy:
        """Defaults ← global policy ← team policy ← key policy; any `enabled: false` wins."""
        team = getattr(principal, "team_id", None)
        layers = (self._stored_policy("global"), self._stored_policy(f"team:{team}") if team is not None else None,
                  getattr(principal, "cache_policy", None))
        policy = merge_policy(self.base_policy(), *layers)
        if policy.semantic and self.embedder is None:
            policy = dataclasses.replace(policy, semantic=False)
        return policy

    def get_policy(self, scope: str, ident: int | None = None) -> dict | None:
        """The stored policy of `global` or `team` (kv rows); key policies live on the key row."""
        return self._stored_policy(_policy_name(scope, ident))

    def set_policy(self, scope: str, ident: int | None, policy: Mapping[str, Any] | None) -> dict | None:
        """Store (or with None, remove) the policy of `global` or `team` ``ident``."""
        name = _policy_name(scope, ident)
        clean = validate_policy(policy) if policy is not None else None
        conn = self._connect()
        try:
            if clean is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (POLICY_KV_PREFIX + name,))
            else:
                conn.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                             (POLICY_KV_PREFIX + name, json.dumps(clean, sort_keys=True)))
        finally:
            conn.close()
        self._policies.pop(name, None)
        return clean

    # ---------------------------------------------------------------- keys
    def _prepare(self, principal: Any, endpoint: str, model: str, body: Any, headers: Any) -> _Prepared | None:
        if not self.settings.cache_enabled:
            return None
        may_read, may_write = cache_control(headers)
        if not (may_read or may_write):
            return None
        policy = self.policy_for(principal)
        if not policy.enabled or not (policy.cache_nondeterministic or is_deterministic(body)):
            return None
        doc = normalized(body)
        part = partition(principal, policy.share)
        prep = _Prepared(endpoint, model, cache_key(part, endpoint, model, doc), policy, doc, part,
                         getattr(principal, "id", None), may_read, may_write)
        if policy.semantic:
            text = semantic_text(endpoint, doc)
            if text and len(text) <= MAX_TEXT_CHARS and text.strip():
                prep.text, prep.scope = text, scope_key(part, endpoint, model, doc)
        return prep

    def cache_key_for(self, principal: Any, endpoint: str, model: str, body: Any) -> str | None:
        """The exact key a request would use (None when it is not cacheable); for tests and tools."""
        prep = self._prepare(principal, endpoint, model, body, None)
        return prep.key if prep else None

    # ---------------------------------------------------------------- lookups
    def lookup(self, principal: Any, endpoint: str, model: str, body: Any, headers: Any) -> Hit | None:
        """The exact tier only: synchronous, well under a millisecond."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_read:
            if prep is not None or self._bypassed(headers):
                self._count_stat("bypassed")
            return None
        hit = self._exact(prep.key)
        self._count_stat("exact" if hit else "misses", lookups=True)
        return hit

    async def lookup_async(self, principal: Any, endpoint: str, model: str, body: Any, headers: Any) -> Hit | None:
        """Exact tier, then (on a miss, when policy allows) the semantic tier on the embedding thread."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_read:
            if prep is not None or self._bypassed(headers):
                self._count_stat("bypassed")
            return None
        hit = self._exact(prep.key)
        if hit is None and prep.text is not None and self.index is not None:
            if self._embedding_pending >= SEMANTIC_MAX_PENDING:
                # embeddings queue up faster than one thread computes them: answer misses without waiting
                self._count_stat("semantic_skipped")
            else:
                self._embedding_pending += 1
                try:
                    hit = await asyncio.get_running_loop().run_in_executor(self._embed_pool, self._semantic, prep)
                except Exception:
                    log.exception("semantic cache lookup failed")
                    hit = None
                finally:
                    self._embedding_pending -= 1
        self._count_stat(hit.tier if hit else "misses", lookups=True)
        return hit

    def _bypassed(self, headers: Any) -> bool:
        return self.settings.cache_enabled and cache_control(headers) == (False, False)

    def _exact(self, key: str) -> Hit | None:
        now = time.time()
        ttl = self.settings.cache_ttl_seconds
        with self._hot_lock:
            entry = self._hot.get(key)
            if entry is not None:
                if ttl and entry.created_at + ttl <= now:
                    self._drop_hot(key)
                    entry = None
                else:
                    self._hot.move_to_end(key)
        if entry is None:
            row = self._read().execute(
                "SELECT id, endpoint, model, key_id, response, prompt_tokens, completion_tokens, created_at FROM cache_entries WHERE cache_key = ?",
                (key,)).fetchone()
            if row is None or (ttl and row[7] + ttl <= now):
                return None
            entry = self._remember(key, row)
        self._touch(key, now)
        return Hit("exact", entry.endpoint, entry.response, entry.prompt_tokens, entry.completion_tokens, entry_id=entry.id)

    def _semantic(self, prep: _Prepared) -> Hit | None:
        assert self.index is not None and prep.text is not None and prep.scope is not None
        vector = self.embedder.embed([prep.text])[0]
        with self._memo_lock:
            self._memo[prep.key] = vector
            if len(self._memo) > _MEMO_MAX:
                self._memo.popitem(last=False)
        found = self.index.search(prep.scope, vector, prep.policy.semantic_threshold, prep.text)
        if found is None:
            return None
        entry_id, similarity = found
        row = self._read().execute(
            "SELECT id, endpoint, model, key_id, response, prompt_tokens, completion_tokens, created_at, cache_key FROM cache_entries WHERE id = ?",
            (entry_id,)).fetchone()
        now = time.time()
        ttl = self.settings.cache_ttl_seconds
        if row is None or (ttl and row[7] + ttl <= now):
            return None
        entry = self._remember(row[8], row[:8])
        self._touch(row[8], now)
        return Hit("semantic", entry.endpoint, entry.response, entry.prompt_tokens, entry.completion_tokens,
                   similarity=round(similarity, 4), entry_id=entry.id)

    def _remember(self, key: str, row: tuple) -> _Hot:
        entry = _Hot(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6], row[7], len(row[4]))
        with self._hot_lock:
            self._put_hot(key, entry)
        return entry

    def _put_hot(self, key: str, entry: _Hot) -> None:
        self._drop_hot(key)
        if entry.size > HOT_MAX_BYTES // 16:
            return
        self._hot[key] = entry
        self._hot_bytes += entry.size
        while len(self._hot) > HOT_MAX_ENTRIES or self._hot_bytes > HOT_MAX_BYTES:
            _, old = self._hot.popitem(last=False)
            self._hot_bytes -= old.size

    def _drop_hot(self, key: str) -> None:
        old = self._hot.pop(key, None)
        if old is not None:
            self._hot_bytes -= old.size

    # ---------------------------------------------------------------- stores
    def store(self, principal: Any, endpoint: str, model: str, body: Any, result: dict, headers: Any) -> None:
        """Queue a non-streamed response for the cache; returns at once."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_write or not complete_response(endpoint, result):
            return
        # serve an immediate repeat from memory while the writer commits the row
        usage = result.get("usage") or {}
        entry = _Hot(None, endpoint, model, prep.key_id, result, int(usage.get("prompt_tokens") or 0),
                     int(usage.get("completion_tokens") or 0), time.time(), len(_encode(result)))
        with self._hot_lock:
            self._put_hot(prep.key, entry)
        self._enqueue(("store", prep, result))

    def store_stream(self, principal: Any, endpoint: str, model: str, body: Any, events: list[bytes], usage: dict,
                     headers: Any) -> None:
        """Queue a streamed answer (its ``data:`` events and usage); folded into one response off the loop."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_write or not events:
            return
        self._enqueue(("stream", prep, events, usage))

    def _touch(self, key: str, when: float) -> None:
        """Count a hit; the writer folds the counts into one UPDATE per entry at its next batch (within a second)."""
        with self._touch_lock:
            last, n = self._touches.get(key, (when, 0))
            self._touches[key] = (max(last, when), n + 1)

    def _enqueue(self, item: tuple) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._count_stat("dropped")

    # ---------------------------------------------------------------- admin
    def purge(self, model: str | None = None, key_id: int | None = None) -> int:
        """Delete entries of a model, of a key, of both, or (neither given) all; returns how many."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(("purge", model, key_id, done))
        return done.result(timeout=60)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far is written (tests, shutdown)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(("flush", done))
        done.result(timeout=timeout)

    def stats(self) -> dict[str, Any]:
        conn = self._connect()  # stats run on arbitrary worker threads: no thread-local connection left behind
        try:
            entries, size, recorded_hits = conn.execute(
                "SELECT count(*), coalesce(sum(size_bytes), 0), coalesce(sum(hits), 0) FROM cache_entries").fetchone()
        finally:
            conn.close()
        with self._stats_lock:
            s = dict(self._stats)
        hits = s["exact"] + s["semantic"]
        base = self.base_policy()
        return {
            "enabled": bool(self.settings.cache_enabled),
            "entries": entries,
            "bytes": size,
            "max_entries": self.settings.cache_max_entries,
            "ttl_seconds": self.settings.cache_ttl_seconds,
            "lookups": s["lookups"],
            "hits": hits,
            "misses": s["misses"],
            "hit_rate": round(hits / s["lookups"], 4) if s["lookups"] else 0.0,
            "hits_by_tier": {"exact": s["exact"], "semantic": s["semantic"]},
            "bypassed": s["bypassed"],
            "stores": s["stores"],
            "dropped_stores": s["dropped"],
            "evicted": s["evicted"],
            "expired": s["expired"],
            "purged": s["purged"],
            "hits_recorded": recorded_hits,
            "hot_entries": len(self._hot),
            "semantic": {
                "enabled": base.semantic,
                "model": getattr(self.embedder, "name", None),
                "threshold": base.semantic_threshold,
                "vectors_loaded": self.index.vectors_loaded() if self.index else 0,
                "skipped_busy": s["semantic_skipped"],
            },
        }

    def clear_memory(self) -> None:
        """Forget every in-memory copy of cache rows (hot entries, semantic vectors, policies, pending touches).

        Called after a database restore: the rows those copies came from may be gone or different."""
        with self._hot_lock:
            self._hot.clear()
            self._hot_bytes = 0
        with self._memo_lock:
            self._memo.clear()
        with self._touch_lock:
            self._touches = {}
        self._policies.clear()
        if self.index is not None:
            self.index.clear()
        conn = self._connect()
        try:
            self._count = conn.execute("SELECT count(*) FROM cache_entries").fetchone()[0]
        finally:
            conn.close()

    def close(self) -> None:
        """Write what is queued, stop the writer and the embedding thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(("stop",))
        self._writer.join(timeout=30)
        self._embed_pool.shutdown(wait=True)

    def _count_stat(self, name: str, lookups: bool = False) -> None:
        with self._stats_lock:
            self._stats[name] += 1
            if lookups:
                self._stats["lookups"] += 1

    # ---------------------------------------------------------------- writer thread
    def _load_scope(self, scope: str) -> Iterable[tuple[int, bytes, str]]:
        now = time.time()
        ttl = self.settings.cache_ttl_seconds
        rows = self._read().execute(
            "SELECT id, embedding, prompt_text, created_at FROM cache_entries WHERE scope_key = ? AND embedding IS NOT NULL",
            (scope,)).fetchall()
        return [(r[0], r[1], r[2]) for r in rows if not ttl or r[3] + ttl > now]

    def _write_loop(self) -> None:
        conn = self._connect()
        next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
        running = True
        while running:
            try:
                first = self._queue.get(timeout=min(TOUCH_INTERVAL_S, max(0.05, next_expiry - time.monotonic())))
            except queue.Empty:
                first = None
            batch = [first] if first is not None else []
            while batch and len(batch) < BATCH_MAX:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
                    batch.append(("expire", None))
                running = self._write_batch(conn, batch)
            except Exception:
                log.exception("cache writer failed; %d queued items lost", len(batch))
                for item in batch:
                    if item[0] in ("purge", "flush", "expire") and item[-1] is not None and not item[-1].done():
                        item[-1].set_exception(RuntimeError("cache writer failed"))
                if conn.in_transaction:
                    conn.rollback()
                running = not any(item[0] == "stop" for item in batch)
        conn.close()

    def _write_batch(self, conn: sqlite3.Connection, batch: list[tuple]) -> bool:
        with self._touch_lock:
            touches, self._touches = self._touches, {}
        if not batch and not touches:
            return True
        waiters: list[tuple[concurrent.futures.Future, Any]] = []
        running = True
        conn.execute("BEGIN IMMEDIATE")
        try:
            for item in batch:
                kind = item[0]
                if kind in ("store", "stream"):
                    try:
                        self._insert(conn, item)
                    except Exception:
                        log.exception("caching a response failed")
                        with self._hot_lock:
                            self._drop_hot(item[1].key)
                elif kind == "expire":
                    count = self._expire(conn)
                    if item[1] is not None:
                        waiters.append((item[1], count))
                elif kind == "purge":
                    self._apply_touches(conn, touches)
                    waiters.append((item[3], self._purge(conn, item[1], item[2])))
                elif kind == "flush":
                    waiters.append((item[1], None))
                elif kind == "stop":
                    running = False
            self._apply_touches(conn, touches)
            if self._count > self.settings.cache_max_entries:
                self._evict(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        for future, value in waiters:
            future.set_result(value)
        return running

    def _apply_touches(self, conn: sqlite3.Connection, touches: dict[str, tuple[float, int]]) -> None:
        if touches:
            conn.executemany("UPDATE cache_entries SET hits = hits + ?, last_hit_at = max(last_hit_at, ?) WHERE cache_key = ?",
                             [(n, when, key) for key, (when, n) in touches.items()])
            touches.clear()

    def _insert(self, conn: sqlite3.Connection, item: tuple) -> None:
        prep: _Prepared = item[1]
        response = item[2] if item[0] == "store" else from_stream(prep.endpoint, item[2], item[3])
        if response is None or not complete_response(prep.endpoint, response):
            return
        usage = response.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        vector: np.ndarray | None = None
        if prep.text is not None and self.embedder is not None:
            with self._memo_lock:
                vector = self._memo.pop(prep.key, None)
            if vector is None:
                try:
                    vector = self.embedder.embed([prep.text])[0]
                except Exception:
                    log.exception("embedding a cached prompt failed; stored for exact hits only")
        text = json.dumps(response, separators=(",", ":"), ensure_ascii=False)
        blob = vector.astype(np.float32).tobytes() if vector is not None else None
        size = len(text.encode()) + (len(blob) if blob else 0) + (len(prep.text.encode()) if prep.text and blob else 0)
        now = time.time()
        row = conn.execute(
            """INSERT INTO cache_entries (cache_key, scope_key, model, key_id, endpoint, prompt_text, response, prompt_tokens,
                   completion_tokens, embedding, created_at, last_hit_at, hits, size_bytes)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)
               ON CONFLICT(cache_key) DO UPDATE SET scope_key = excluded.scope_key, prompt_text = excluded.prompt_text,
                   response = excluded.response, prompt_tokens = excluded.prompt_tokens,
                   completion_tokens = excluded.completion_tokens, embedding = excluded.embedding,
                   created_at = excluded.created_at, last_hit_at = excluded.last_hit_at, size_bytes = excluded.size_bytes
               RETURNING id, hits""",
            (prep.key, prep.scope or "", prep.model, prep.key_id, prep.endpoint, prep.text if blob else None, text,
             prompt_tokens, completion_tokens, blob, now, now, size)).fetchone()
        entry_id, hits = row
        if hits == 0:
            self._count += 1
        with self._hot_lock:
            self._put_hot(prep.key, _Hot(entry_id, prep.endpoint, prep.model, prep.key_id, response, prompt_tokens,
                                         completion_tokens, now, len(text)))
        if self.index is not None:
            if blob is not None and prep.scope is not None:
                self.index.add(prep.scope, entry_id, vector, prep.text or "")
            else:
                self.index.remove([entry_id])
        self._count_stat("stores")

    def _deleted(self, rows: list[tuple[int, str]], stat: str) -> int:
        if not rows:
            return 0
        with self._hot_lock:
            for _, key in rows:
                self._drop_hot(key)
        if self.index is not None:
            self.index.remove(r[0] for r in rows)
        self._count = max(0, self._count - len(rows))
        with self._stats_lock:
            self._stats[stat] += len(rows)
        return len(rows)

    def _evict(self, conn: sqlite3.Connection) -> None:
        self._count = conn.execute("SELECT count(*) FROM cache_entries").fetchone()[0]
        cap = self.settings.cache_max_entries
        excess = self._count - cap
        if excess <= 0:
            return
        excess += cap // 100  # evict a little more, so a full cache does not evict on every store
        rows = conn.execute(
            "DELETE FROM cache_entries WHERE id IN (SELECT id FROM cache_entries ORDER BY last_hit_at, id LIMIT ?) RETURNING id, cache_key",
            (excess,)).fetchall()
        self._deleted(rows, "evicted")

    def _expire(self, conn: sqlite3.Connection) -> int:
        ttl = self.settings.cache_ttl_seconds
        if not ttl:
            return 0
        rows = conn.execute("DELETE FROM cache_entries WHERE created_at <= ? RETURNING id, cache_key", (time.time() - ttl,)).fetchall()
        return self._deleted(rows, "expired")

    def expire_now(self) -> int:
        """Delete expired rows at once (the writer also does it every minute); returns how many."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(("expire", done))
        return done.result(timeout=60)

    def _purge(self, conn: sqlite3.Connection, model: str | None, key_id: int | None) -> int:
        where, args = [], []
        if model is not None:
            if ":" in model:
                where.append("model = ?")
                args.append(model)
            else:  # a family: all its variants
                where.append("(model = ? OR model LIKE ? ESCAPE '\\')")
                args += [model, model.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"]
        if key_id is not None:
            where.append("key_id = ?")
            args.append(key_id)
        sql = "DELETE FROM cache_entries" + (" WHERE " + " AND ".join(where) if where else "") + " RETURNING id, cache_key"
        rows = conn.execute(sql, args).fetchall()
        if not where:
            with self._hot_lock:
                self._hot.clear()
                self._hot_bytes = 0
            if self.index is not None:
                self.index.clear()
        return self._deleted(rows, "purged")


def _policy_name(scope: str, ident: int | None) -> str:
    if scope == "global":
        return "global"
    if scope == "team" and ident is not None:
        return f"team:{int(ident)}"
    raise ValueError("policy scope must be `global` or `team` with an id (key policies live on the key)")
