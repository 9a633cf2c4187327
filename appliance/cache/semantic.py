"""The semantic tier's search: the nearest cached prompt within the same scope that passes the lexical check.

Vectors live in the ``cache_entries.embedding`` BLOB column (float32), which
stays the source of truth. Searches run over a numpy matrix per scope
(model + system prompt + earlier turns + sampling parameters), loaded lazily
from the database and kept in step by the cache's writer. At this scale
(entries are capped by ``cache_max_entries``, a scope rarely holds more than a
few thousand) one matrix-vector product per lookup takes well under a
millisecond, so no vector extension is needed — this Python's sqlite3 cannot
load one anyway.

A candidate above the similarity threshold is served only when it also passes
:func:`appliance.cache.lexical.compatible` (numbers, units, negation, names).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import numpy as np

from appliance.cache.lexical import compatible

MAX_TEXT_CHARS = 2000  # longer prompts are not matched semantically: small differences drown in them
CANDIDATES = 4


class _Scope:
    """One scope's unit vectors in a buffer that grows by doubling, so an insert is amortised O(1)."""

    def __init__(self, dim: int, ids: list[int], vectors: list[np.ndarray], texts: list[str]):
        capacity = max(16, len(ids))
        self.buf = np.zeros((capacity, dim), dtype=np.float32)
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.n = len(ids)
        if vectors:
            self.buf[: self.n] = np.vstack(vectors)
            self.ids[: self.n] = ids
        self.texts = list(texts)

    @property
    def vectors(self) -> np.ndarray:
        return self.buf[: self.n]

    def put(self, entry_id: int, vector: np.ndarray, text: str) -> None:
        found = np.flatnonzero(self.ids[: self.n] == entry_id)
        if len(found):
            row = int(found[0])
            self.buf[row], self.texts[row] = vector, text
            return
        if self.n == len(self.ids):
            self.buf = np.concatenate([self.buf, np.zeros_like(self.buf)])
            self.ids = np.concatenate([self.ids, np.zeros_like(self.ids)])
        self.buf[self.n], self.ids[self.n] = vector, entry_id
        self.texts.append(text)
        self.n += 1

    def drop(self, entry_ids: np.ndarray) -> None:
        keep = ~np.isin(self.ids[: self.n], entry_ids)
        if keep.all():
            return
        kept = int(keep.sum())
        self.buf[:kept] = self.buf[: self.n][keep]
        self.ids[:kept] = self.ids[: self.n][keep]
        self.texts = [t for t, k in zip(self.texts, keep, strict=True) if k]
        self.n = kept


Loader = Callable[[str], Iterable[tuple[int, bytes, str]]]


class SemanticIndex:
    """Per-scope matrices of unit vectors, loaded on first use through ``loader(scope)``."""

    def __init__(self, loader: Loader, dim: int):
        self._loader = loader
        self.dim = dim
        self._scopes: dict[str, _Scope] = {}
        self._lock = threading.RLock()

    def _scope(self, scope: str) -> _Scope:
        s = self._scopes.get(scope)
        if s is None:
            ids, vectors, texts = [], [], []
            for entry_id, blob, text in self._loader(scope):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape[0] != self.dim:
                    continue
                ids.append(entry_id)
                vectors.append(vec)
                texts.append(text or "")
            s = _Scope(self.dim, ids, vectors, texts)
            self._scopes[scope] = s
        return s

    def search(self, scope: str, vector: np.ndarray, threshold: float, text: str) -> tuple[int, float] | None:
        """The best entry at or above ``threshold`` that passes :func:`compatible`, as (id, similarity)."""
        with self._lock:
            s = self._scope(scope)
            if not s.n:
                return None
            sims = s.vectors @ vector.astype(np.float32)
            order = np.argsort(-sims)[:CANDIDATES]
            for i in order:
                sim = float(sims[i])
                if sim < threshold:
                    return None
                if compatible(text, s.texts[i]):
                    return int(s.ids[i]), sim
        return None

    def add(self, scope: str, entry_id: int, vector: np.ndarray, text: str) -> None:
        """Record a stored entry in a loaded scope (unloaded scopes read it from the database later)."""
        with self._lock:
            s = self._scopes.get(scope)
            if s is not None:
                s.put(entry_id, vector.astype(np.float32).reshape(-1), text)

    def remove(self, entry_ids: Iterable[int]) -> None:
        drop = np.fromiter(entry_ids, dtype=np.int64)
        if not len(drop):
            return
        with self._lock:
            for s in self._scopes.values():
                if s.n:
                    s.drop(drop)

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()

    def vectors_loaded(self) -> int:
        with self._lock:
            return sum(s.n for s in self._scopes.values())
