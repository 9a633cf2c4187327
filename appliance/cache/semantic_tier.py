"""The semantic tier at work: prompts embedded on one worker thread, searched in the index, answered from the row.

A lookup runs only after an exact miss, and only while few embeddings are
waiting: when they queue up faster than the thread computes them, new semantic
lookups are skipped (answered as misses) instead of waiting. The query vector of
a miss is remembered, so storing the answer that follows does not embed the
same prompt again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import OrderedDict

import numpy as np

from appliance.cache.counters import CacheCounters
from appliance.cache.embedder import Embedder
from appliance.cache.entries import EntryStore
from appliance.cache.exact import ExactTier
from appliance.cache.keys import Prepared
from appliance.cache.replay import Hit
from appliance.cache.semantic import SemanticIndex

log = logging.getLogger("appliance.cache.semantic_tier")

SEMANTIC_MAX_PENDING = 4  # semantic lookups waiting for the embedding thread before new ones are skipped
MEMO_MAX = 1024


class SemanticTier:
    """The embedder, its thread, the query-vector memo and the index of stored prompts."""

    def __init__(self, embedder: Embedder, entries: EntryStore, exact: ExactTier, counters: CacheCounters):
        self.embedder = embedder
        self.index = SemanticIndex(entries.scope_rows, embedder.dim)
        self._exact = exact
        self._counters = counters
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()  # key -> query vector of a semantic miss
        self._memo_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cache-embed")
        self._pending = 0  # changed on the event loop only

    async def lookup(self, prep: Prepared) -> Hit | None:
        """The nearest compatible cached prompt of ``prep``'s scope, embedded on the worker thread."""
        if self._pending >= SEMANTIC_MAX_PENDING:
            self._counters.add("semantic_skipped")
            return None
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._search, prep)
        except Exception:
            log.exception("semantic cache lookup failed")
            return None
        finally:
            self._pending -= 1

    def _search(self, prep: Prepared) -> Hit | None:
        assert prep.text is not None and prep.scope is not None
        vector = self.embedder.embed([prep.text])[0]
        with self._memo_lock:
            self._memo[prep.key] = vector
            if len(self._memo) > MEMO_MAX:
                self._memo.popitem(last=False)
        found = self.index.search(prep.scope, vector, prep.policy.semantic_threshold, prep.text)
        if found is None:
            return None
        entry_id, similarity = found
        return self._exact.lookup_id(entry_id, similarity)

    def vector_for(self, key: str, text: str) -> np.ndarray | None:
        """The embedding of a stored prompt: the one its miss computed, else a new one (None on failure)."""
        with self._memo_lock:
            vector = self._memo.pop(key, None)
        if vector is not None:
            return vector
        try:
            return self.embedder.embed([text])[0]
        except Exception:
            log.exception("embedding a cached prompt failed; stored for exact hits only")
            return None

    def forget(self) -> None:
        """Drop remembered query vectors and every loaded scope (they are read again from the rows)."""
        with self._memo_lock:
            self._memo.clear()
        self.index.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
