"""The exact tier: an in-memory LRU of hot entries in front of the ``cache_entries`` rows.

A lookup tries the hot LRU, then, only when :class:`StoredKeys` says a row may
exist, one indexed SELECT on ``cache_key``; a row read from SQLite becomes a hot
entry. A miss, the common case, costs no SQLite read. Hits are not written at once: they are counted
in :class:`PendingHits`, which the writer folds into one UPDATE per entry at its
next batch.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from appliance.cache.replay import Hit
from appliance.jsontypes import JsonObject
from appliance.settings import Settings

HOT_MAX_ENTRIES = 4096
HOT_MAX_BYTES = 64 << 20


def expired(created_at: float, ttl: int, now: float) -> bool:
    """Whether an entry made at ``created_at`` is past the TTL (0: entries never expire)."""
    return bool(ttl) and created_at + ttl <= now


@dataclass(slots=True)
class HotEntry:
    """A cached answer held in memory."""

    id: int | None  # None until the writer has committed the row
    endpoint: str
    model: str
    key_id: int | None
    response: JsonObject
    prompt_tokens: int
    completion_tokens: int
    created_at: float
    size: int


class HotEntries:
    """The LRU of hot entries, bounded by count and by bytes; safe to use from any thread."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, HotEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, key: str, ttl: int, now: float) -> HotEntry | None:
        """The entry of ``key`` unless it is absent or expired (an expired one is dropped)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if expired(entry.created_at, ttl, now):
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: HotEntry) -> None:
        """Hold ``entry`` under ``key`` (an entry over 1/16 of the byte budget is not held)."""
        with self._lock:
            self._drop(key)
            if entry.size > HOT_MAX_BYTES // 16:
                return
            self._entries[key] = entry
            self._bytes += entry.size
            while len(self._entries) > HOT_MAX_ENTRIES or self._bytes > HOT_MAX_BYTES:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.size

    def drop(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size


def fingerprint(key: str) -> int:
    """The first 64 bits of a cache key (a sha256 in hex): what :class:`StoredKeys` keeps of it."""
    return int(key[:16], 16)


class StoredKeys:
    """The fingerprints of the keys stored in ``cache_entries``: a row can exist only if its key's is here.

    The cache writer, which owns every change to the rows, adds a key before its
    insert commits and removes the keys of the rows it deletes, so the set never
    lacks a stored key; a fingerprint shared by two keys, or one whose insert
    rolled back, only costs a read that finds nothing. About 60 bytes per entry.
    """

    def __init__(self) -> None:
        self._keys: set[int] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def may_hold(self, key: str) -> bool:
        return fingerprint(key) in self._keys

    def add(self, key: str) -> None:
        with self._lock:
            self._keys.add(fingerprint(key))

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.difference_update(fingerprint(k) for k in keys)

    def replace(self, keys: Iterable[str]) -> None:
        """Hold exactly ``keys`` (at start, and after a database restore)."""
        fresh = {fingerprint(k) for k in keys}
        with self._lock:
            self._keys = fresh


class PendingHits:
    """Hits counted since the writer's last batch: cache key -> (latest hit time, count)."""

    def __init__(self) -> None:
        self._hits: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def count(self, key: str, when: float) -> None:
        with self._lock:
            last, n = self._hits.get(key, (when, 0))
            self._hits[key] = (max(last, when), n + 1)

    def take(self) -> dict[str, tuple[float, int]]:
        """The counts so far, leaving none pending."""
        with self._lock:
            hits, self._hits = self._hits, {}
        return hits


class EntryReader(Protocol):
    """Where hot entries come from on a miss: the ``cache_entries`` rows (see :mod:`appliance.cache.entries`)."""

    def by_key(self, key: str, now: float) -> HotEntry | None: ...

    def by_id(self, entry_id: int, now: float) -> tuple[str, HotEntry] | None: ...


class ExactTier:
    """Reads of cached answers by exact key or by row id, each counted as a hit."""

    def __init__(self, settings: Settings, rows: EntryReader, hot: HotEntries, hits: PendingHits, stored: StoredKeys):
        self._settings = settings
        self._rows = rows
        self._hot = hot
        self._hits = hits
        self._stored = stored

    def lookup(self, key: str) -> Hit | None:
        """The answer stored under ``key``: synchronous, well under a millisecond."""
        now = time.time()
        entry = self._hot.fresh(key, self._settings.cache_ttl_seconds, now)
        if entry is None:
            if not self._stored.may_hold(key):
                return None
            entry = self._rows.by_key(key, now)
            if entry is None:
                return None
            self._hot.put(key, entry)
        return self._served(key, entry, now, "exact")

    def lookup_id(self, entry_id: int, similarity: float) -> Hit | None:
        """The answer of row ``entry_id``, as a semantic hit of the given similarity."""
        now = time.time()
        found = self._rows.by_id(entry_id, now)
        if found is None:
            return None
        key, entry = found
        self._hot.put(key, entry)
        return self._served(key, entry, now, "semantic", round(similarity, 4))

    def _served(self, key: str, entry: HotEntry, now: float, tier: str, similarity: float | None = None) -> Hit:
        self._hits.count(key, now)
        return Hit(
            tier,
            entry.endpoint,
            entry.response,
            entry.prompt_tokens,
            entry.completion_tokens,
            similarity=similarity,
            entry_id=entry.id,
        )
