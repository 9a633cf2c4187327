"""The semantic tier: nearest cached prompt within the same scope, then a lexical check.

Vectors live in the ``cache_entries.embedding`` BLOB column (float32), which
stays the source of truth. Searches run over a numpy matrix per scope
(model + system prompt + earlier turns + sampling parameters), loaded lazily
from the database and kept in step by the cache's writer. At this scale
(entries are capped by ``cache_max_entries``, a scope rarely holds more than a
few thousand) one matrix-vector product per lookup takes well under a
millisecond, so no vector extension is needed — this Python's sqlite3 cannot
load one anyway.

Embeddings place "What is 2+2?" and "What is 2+3?" close together, so a
candidate above the threshold must also agree with the query on its numbers
and on negation (see :func:`compatible`); near misses of that kind are the
false hits a cache must not serve.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

MAX_TEXT_CHARS = 2000  # longer prompts are not matched semantically: small differences drown in them
CANDIDATES = 4

_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
_NUMBER_WORDS = {
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "twenty", "thirty", "forty", "fifty", "hundred", "thousand", "million", "billion", "half", "double", "twice",
    "first", "second", "third", "fourth", "fifth", "last",
}
_NEGATION = {
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "cannot", "except", "unless",
    "isnt", "arent", "wasnt", "werent", "dont", "doesnt", "didnt", "wont", "cant", "couldnt", "wouldnt", "shouldnt",
    "hasnt", "havent", "hadnt", "mustnt", "neednt",
}
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")
_SENTENCE = re.compile(r"(?<=[.!?:;])\s+|\n+")


def _words(text: str) -> list[str]:
    return [w.replace("'", "") for w in _WORD.findall(text.lower())]


def _names(text: str) -> frozenset[str]:
    """Capitalized words that do not start a sentence, and acronyms: the named things of a prompt."""
    names = set()
    for sentence in _SENTENCE.split(text):
        for i, tok in enumerate(_TOKEN.findall(sentence)):
            if tok == "I" or tok.startswith("I'"):
                continue
            if (i > 0 and tok[0].isupper()) or (len(tok) > 1 and tok.isupper()):
                names.add(tok.lower())
    return frozenset(names)


def signature(text: str) -> tuple[frozenset, int, frozenset[str], frozenset[str]]:
    """(numbers, negation count, named things, all words) of a prompt."""
    words = _words(text)
    numbers = Counter(n.replace(",", "") for n in _NUMBER.findall(text))
    numbers.update(w for w in words if w in _NUMBER_WORDS)
    negations = sum(1 for w in words if w in _NEGATION)
    return frozenset(numbers.items()), negations, _names(text), frozenset(words)


def compatible(query: str, candidate: str) -> bool:
    """Whether two similar prompts may share an answer: the same numbers, as many negations,
    and every named thing of each (case-insensitively) present in the other."""
    qn, qneg, qnames, qwords = signature(query)
    cn, cneg, cnames, cwords = signature(candidate)
    if qn != cn or qneg != cneg:
        return False
    return all(_in(n, cwords) for n in qnames) and all(_in(n, qwords) for n in cnames)


def _in(name: str, words: frozenset[str]) -> bool:
    return all(part in words for part in _words(name))


@dataclass
class _Scope:
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    vectors: np.ndarray | None = None
    texts: list[str] = field(default_factory=list)


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
            s = _Scope(np.asarray(ids, dtype=np.int64), np.vstack(vectors) if vectors else None, texts)
            self._scopes[scope] = s
        return s

    def search(self, scope: str, vector: np.ndarray, threshold: float, text: str) -> tuple[int, float] | None:
        """The best entry at or above ``threshold`` that passes :func:`compatible`, as (id, similarity)."""
        with self._lock:
            s = self._scope(scope)
            if s.vectors is None or not len(s.ids):
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
            if s is None:
                return
            keep = s.ids != entry_id
            vec = vector.astype(np.float32).reshape(1, -1)
            if s.vectors is None:
                s.ids, s.vectors, s.texts = np.asarray([entry_id], dtype=np.int64), vec, [text]
                return
            s.texts = [t for t, k in zip(s.texts, keep) if k] + [text]
            s.ids = np.append(s.ids[keep], entry_id)
            s.vectors = np.vstack([s.vectors[keep], vec])

    def remove(self, entry_ids: Iterable[int]) -> None:
        drop = np.fromiter(entry_ids, dtype=np.int64)
        if not len(drop):
            return
        with self._lock:
            for s in self._scopes.values():
                if s.vectors is None or not len(s.ids):
                    continue
                keep = ~np.isin(s.ids, drop)
                if keep.all():
                    continue
                s.ids, s.vectors = s.ids[keep], s.vectors[keep]
                s.texts = [t for t, k in zip(s.texts, keep) if k]

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()

    def vectors_loaded(self) -> int:
        with self._lock:
            return sum(len(s.ids) for s in self._scopes.values())
