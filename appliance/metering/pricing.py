"""Prices per million tokens, and what a request costs.

A model's price is found as ``family:variant``, then ``family``, then ``*``;
a model with no matching row is free. Prices are small and read on every
settle, so they are kept in memory and reloaded after a change (the admin API
calls :meth:`PriceBook.invalidate`) or after ``ttl`` seconds at most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from appliance.errors import BadRequest

PER = 1_000_000.0


@dataclass(frozen=True, slots=True)
class Rate:
    input_per_m: float = 0.0
    output_per_m: float = 0.0
    cached_per_m: float = 0.0

    @property
    def highest(self) -> float:
        return max(self.input_per_m, self.output_per_m, self.cached_per_m)


FREE = Rate()


def candidates(model: str, variant: str | None) -> list[str]:
    """Price rows that may apply to a model, most specific first."""
    family, _, own_variant = model.partition(":")
    variant = own_variant or variant
    names = [f"{family}:{variant}"] if variant else []
    names += [family, "*"]
    return names


def refuse_unknown_family(family: str, known: Collection[str]) -> None:
    """A price for a family the appliance does not know would never apply (requests name installed models, which
    belong to the catalog's families or to ones an import added): refuse it, naming the families it knows."""
    if family in known:
        return
    names = ", ".join(sorted(known)) or "none yet"
    raise BadRequest(
        f"No model family named {family}. A price names *, a known family or family:variant; known families: {names}.",
        param="model",
        code="unknown_model_family",
    )


def cost_of(rate: Rate, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int, cache_hit: bool) -> float:
    """Cost of one request. A cache hit is priced entirely at the cached rate; otherwise
    prompt tokens the engine served from its prefix cache are priced at the cached rate."""
    if cache_hit:
        return (prompt_tokens + completion_tokens) * rate.cached_per_m / PER
    cached = min(max(cached_tokens, 0), prompt_tokens)
    return (
        (prompt_tokens - cached) * rate.input_per_m + cached * rate.cached_per_m + completion_tokens * rate.output_per_m
    ) / PER


class PriceBook:
    """In-memory copy of the ``prices`` table."""

    def __init__(
        self,
        loader: Callable[[], Iterable[tuple[str, float, float, float]]],
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._loader = loader
        self._ttl = ttl
        self._clock = clock
        self._rates: dict[str, Rate] = {}
        self._highest: dict[str, float] = {}  # memo of highest_rate, emptied on reload
        self._expires = -1.0
        self._generation = 0
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        self._generation += 1
        self._expires = -1.0

    def _table(self) -> dict[str, Rate]:
        if self._clock() >= self._expires:
            with self._lock:
                if self._clock() >= self._expires:
                    generation = self._generation
                    self._rates = {m: Rate(i, o, c) for m, i, o, c in self._loader()}
                    self._highest = {}
                    if generation == self._generation:  # else a change raced the read: reload next time
                        self._expires = self._clock() + self._ttl
        return self._rates

    def rate(self, model: str, variant: str | None = None) -> Rate:
        table = self._table()
        for name in candidates(model, variant):
            rate = table.get(name)
            if rate is not None:
                return rate
        return FREE

    def highest_rate(self, model: str) -> float:
        """Upper bound of the per-million rate any request to ``model`` can be priced at.

        Admission often knows only the family; a variant's own price may be higher than
        the family's, so the estimate takes the most expensive row that could apply.
        """
        table = self._table()
        highest = self._highest.get(model)
        if highest is None:
            family, _, variant = model.partition(":")
            if variant:
                highest = self.rate(model).highest
            else:
                rates = [r for name, r in table.items() if name.startswith(family + ":")]
                rates.append(table.get(family) or table.get("*") or FREE)
                highest = max(r.highest for r in rates)
            if len(self._highest) < 4096:
                self._highest[model] = highest
        return highest
