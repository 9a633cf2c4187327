"""Labelled prompt pairs for the semantic cache, and the cache's decisions on them.

Each pair is (a, b, same, kind): the cache holds ``a``; ``b`` arrives. A hit on
a pair marked ``same`` (a paraphrase) is a good hit; a hit on a near miss (a
changed number or unit, a negation, another entity, an antonym, swapped roles)
is a false hit that would serve a wrong answer.

The sets in ``tests/data``:

- ``semantic_pairs.jsonl`` (200 pairs): the lexical check was tuned while looking at its failures;
- ``semantic_pairs_heldout.jsonl`` (100 pairs): written after that check was frozen, used to choose the threshold;
- ``semantic_pairs_fresh.jsonl`` (61 pairs: units, comparatives, ordinals, time and place swaps): written after
  the unit comparison was added and frozen, and measured once.

A cache decision goes through the cache's own search (:class:`appliance.cache.semantic.SemanticIndex`,
one scope per pair holding ``a``): the similarity threshold and the lexical check exactly as served.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from appliance.cache.embedder import Embedder
from appliance.cache.semantic import SemanticIndex

DATA = Path(__file__).resolve().parent / "data"
TUNING = DATA / "semantic_pairs.jsonl"
HELDOUT = DATA / "semantic_pairs_heldout.jsonl"
FRESH = DATA / "semantic_pairs_fresh.jsonl"
ALL_SETS = (TUNING, HELDOUT, FRESH)


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    same: bool
    kind: str


def load_pairs(path: Path) -> list[Pair]:
    return [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Embedded:
    """Pairs with the unit vectors of their two prompts (row i of ``a`` and ``b`` is pair i)."""

    pairs: list[Pair]
    a: np.ndarray
    b: np.ndarray

    @property
    def similarities(self) -> np.ndarray:
        return np.einsum("ij,ij->i", self.a, self.b)

    def cosine_hits(self, threshold: float) -> list[bool]:
        """Similarity alone."""
        return [bool(s >= threshold) for s in self.similarities]

    def cache_hits(self, threshold: float) -> list[bool]:
        """What the cache serves: its search over a scope holding only ``a``."""
        index = SemanticIndex(lambda scope: [(0, self.a[int(scope)].tobytes(), self.pairs[int(scope)].a)], self.a.shape[1])
        return [index.search(str(i), self.b[i], threshold, p.b) is not None for i, p in enumerate(self.pairs)]

    def __add__(self, other: Embedded) -> Embedded:
        return Embedded(self.pairs + other.pairs, np.vstack([self.a, other.a]), np.vstack([self.b, other.b]))


def embed(embedder: Embedder, pairs: list[Pair]) -> Embedded:
    return Embedded(pairs, embedder.embed([p.a for p in pairs]), embedder.embed([p.b for p in pairs]))


@dataclass(frozen=True)
class Score:
    paraphrases: int
    good_hits: int
    near_misses: int
    false_hits: int
    false_by_kind: Counter[str]

    @property
    def hit_rate(self) -> float:
        return self.good_hits / max(1, self.paraphrases)

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / max(1, self.near_misses)


def score(pairs: list[Pair], hits: list[bool]) -> Score:
    same = [hit for p, hit in zip(pairs, hits, strict=True) if p.same]
    false = Counter(p.kind for p, hit in zip(pairs, hits, strict=True) if hit and not p.same)
    return Score(len(same), sum(same), len(pairs) - len(same), sum(false.values()), false)
