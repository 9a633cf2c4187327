"""What the response cache has done since the daemon started: lookups by outcome, stores, deletions."""

from __future__ import annotations

import threading

COUNTERS = (
    "lookups",
    "exact",
    "semantic",
    "misses",
    "bypassed",
    "stores",
    "dropped",
    "evicted",
    "expired",
    "purged",
    "semantic_skipped",
)


class CacheCounters:
    """Counters shared by the lookup paths, the embedding thread and the writer (under a lock)."""

    def __init__(self) -> None:
        self._values = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def lookup(self, outcome: str) -> None:
        """One lookup answered with ``outcome`` (a hit's tier, or `misses`)."""
        with self._lock:
            self._values[outcome] += 1
            self._values["lookups"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
