"""Admission: reserve on every quota counter of the key and its team, or refuse with 429.

A principal without quotas costs two dict look-ups: limits are cached per key and
team for :data:`QUOTA_CACHE_SECONDS` (the "no quota" fact too) and dropped when a
quota changes. With quotas, the admission is planned on the caller's side
(:meth:`Admissions.prepare`) and its :class:`~appliance.metering.reservation.Reservation`
is made inside a write transaction: the group-commit writer's batch for the gateway
(the event loop does no SQLite work for it), or one of its own. The reservation
(:mod:`appliance.metering.reservation`) holds one conditional UPDATE per counter in a
savepoint, so nothing can overspend; :meth:`Admissions.conclude` turns what it was
granted or refused into the admission or a 429.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from appliance.accounts.keys import Principal
from appliance.errors import Conflict, EngineUnavailable, QuotaExceeded, RateLimited
from appliance.metering.pricing import PER, PriceBook
from appliance.metering.quotas import DIMENSIONS, Dimension, Windows, ratelimit_headers, refusal_message, retry_after
from appliance.metering.reservation import Granted, Hold, Plan, Refusal, Reservation
from appliance.metrics import Metrics
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.admission")

QUOTA_CACHE_SECONDS = 30.0
_QUOTA_COLUMNS = ", ".join(d.name for d in DIMENSIONS)

#: The limits of one key or team: (dimension, limit) for each dimension it has a limit on.
Limits = tuple[tuple[Dimension, float], ...]


@dataclass(slots=True)
class Admission:
    """An admitted request: what it holds, and the headers for its success response."""

    request_id: str
    endpoint: str
    model: str
    key_id: int | None
    team_id: int | None
    estimated_tokens: int
    cached: bool
    admitted_at: float  # wall clock: the usage row's created_at, so it lands in the admitted window
    started: float = field(default_factory=time.perf_counter)
    holds: tuple[Hold, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    finished: bool = False
    cost: float | None = None
    max_tokens: int | None = None  # the completion cap the engine must be given (None: no budget bounds it)
    in_flight: bool = False  # admitted and not yet settled or released: counted in the meter's requests in flight


class Admissions:
    """Admits requests against the quotas, on the meter's connection under its lock."""

    def __init__(
        self,
        settings: Settings,
        conn: sqlite3.Connection,
        lock: threading.RLock,
        prices: PriceBook,
        metrics: Metrics,
        clock: Callable[[], float],
    ):
        self._settings = settings
        self._conn = conn
        self._lock = lock
        self._prices = prices
        self._metrics = metrics
        self._clock = clock
        self._windows = Windows()
        self._limits: dict[tuple[str, int], tuple[float, Limits]] = {}
        self._generation = 0  # bumped by invalidate, so a read racing a change is not cached

    def invalidate(self) -> None:
        """Forget cached limits (call after any quota change)."""
        self._generation += 1
        self._limits.clear()

    def _subject_limits(self, subject: str, subject_id: int) -> Limits:
        entry = self._limits.get((subject, subject_id))
        now = time.monotonic()
        if entry is not None and entry[0] > now:
            return entry[1]
        generation = self._generation
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_QUOTA_COLUMNS} FROM quotas WHERE subject_type = ? AND subject_id = ?", (subject, subject_id)
            ).fetchone()
        limits = tuple((d, float(v)) for d, v in zip(DIMENSIONS, row or (), strict=False) if v is not None)  # no row: no limits
        if generation == self._generation:
            self._limits[(subject, subject_id)] = (now + QUOTA_CACHE_SECONDS, limits)
        return limits

    def prepare(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        estimated_tokens: int,
        cached: bool,
        cap: bool,
        max_tokens: int | None,
    ) -> tuple[Admission, Reservation | None]:
        """The admission, and the reservation still to make in a transaction (None: no quota applies)."""
        key_id = principal.id if principal.kind == "key" else None
        team_id = principal.team_id
        now = self._clock()
        admission = Admission(request_id, endpoint, model, key_id, team_id, estimated_tokens, cached, now)
        key_limits = self._subject_limits("key", key_id) if key_id is not None else ()
        team_limits = self._subject_limits("team", team_id) if team_id is not None else ()
        if not key_limits and not team_limits:
            return admission, None
        plans = self._plan(now, model, estimated_tokens, cached, (("key", key_id, key_limits), ("team", team_id, team_limits)))
        prompt = max(0, estimated_tokens) if cap and not cached else None
        per_cost_token = self._prices.highest_rate(model) / PER if prompt is not None else 0.0
        cache_counts = self._settings.cache_counts_against_quota
        return admission, Reservation(request_id, now, plans, prompt, max_tokens, per_cost_token, cache_counts)

    def conclude(self, admission: Admission, reservation: Reservation, outcome: Granted | Refusal | None) -> Admission:
        """The admission with what its reservation holds; raises 429 for a refusal, 409 for a request id in flight."""
        if outcome is None:
            raise Conflict(f"Request id {reservation.request_id!r} is already in flight.")
        if isinstance(outcome, Refusal):
            self._refuse(outcome, reservation.now, admission.model)
        admission.holds = outcome.holds
        admission.headers = ratelimit_headers(outcome.states, reservation.now)
        if outcome.capped is not None:
            admission.max_tokens = outcome.capped
            admission.estimated_tokens = max(0, admission.estimated_tokens) + outcome.capped
        return admission

    def _plan(
        self, now: float, model: str, estimated_tokens: int, cached: bool, subjects: tuple[tuple[str, int | None, Limits], ...]
    ) -> list[Plan]:
        tokens = 0 if cached and not self._settings.cache_counts_against_quota else max(0, estimated_tokens)
        plans = []
        for subject, subject_id, limits in subjects:
            for dimension, limit in limits:
                if dimension.unit == "tokens":
                    amount = float(tokens)
                elif dimension.unit == "cost":
                    rate = self._prices.rate(model).cached_per_m if cached else self._prices.highest_rate(model)
                    amount = max(0, estimated_tokens) * rate / PER
                else:  # a request, or a concurrency slot
                    amount = 1.0
                start, end = self._windows.bounds(dimension.window, now)
                assert subject_id is not None  # a subject without an id has no limits
                plans.append(Plan(subject, subject_id, dimension, start, end, limit, amount))
        return plans

    def _refuse(self, refusal: Refusal, now: float, model: str) -> NoReturn:
        refused = refusal.plan
        refused_state = next(
            state
            for p, state in zip(refusal.plans, refusal.states, strict=True)
            if (p.subject, p.subject_id, p.dimension) == (refused.subject, refused.subject_id, refused.dimension)
        )
        headers = ratelimit_headers(refusal.states, now)
        headers["Retry-After"] = retry_after(refused_state, now)
        self._metrics.observe_refusal(model, refused.dimension.name)
        error = QuotaExceeded if refused.dimension.budget else RateLimited
        raise error(refusal_message(refused_state, refused.amount), headers=headers)


def busy(exc: sqlite3.OperationalError) -> EngineUnavailable:
    """The 503 for a metering database that stayed locked."""
    log.error("quota admission failed: %s", exc)
    return EngineUnavailable("The metering database is busy; retry shortly.", headers={"Retry-After": "1"})
