"""Admission: reserve on every quota counter of the key and its team, or refuse with 429.

A principal without quotas costs two dict look-ups: limits are cached per key and
team for :data:`QUOTA_CACHE_SECONDS` (the "no quota" fact too) and dropped when a
quota changes. With quotas, the admission is planned on the caller's side
(:meth:`Admissions.prepare`) and its :class:`Reservation` is made inside a write
transaction: the group-commit writer's batch for the gateway (the event loop does
no SQLite work for it), or one of its own. It holds one conditional UPDATE per
counter::

    UPDATE quota_counters SET reserved = reserved + :x
     WHERE <subject, dimension, window> AND spent + reserved + :x <= limit_value

inside a savepoint, so no interleaving of admissions, in this process or another,
can overspend, and a refusal undoes only its own partial reservation. The counters
held and the amounts are written to ``reservations`` in the same transaction; that
row, not memory, says what is still held. A counter made by an admission starts from
what the ledger holds for its window (:mod:`appliance.metering.window_spend`), so a
limit set mid-window counts what the window already spent.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NoReturn

from appliance.accounts.keys import Principal
from appliance.errors import Conflict, EngineUnavailable, QuotaExceeded, RateLimited
from appliance.metering.pricing import PER, PriceBook
from appliance.metering.quotas import (
    DAY,
    DIMENSIONS,
    CounterState,
    Dimension,
    Windows,
    completion_cap,
    ratelimit_headers,
    refusal_message,
    retry_after,
)
from appliance.metering.window_spend import create_sql, spent_sql
from appliance.metrics import Metrics
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.admission")

QUOTA_CACHE_SECONDS = 30.0
_QUOTA_COLUMNS = ", ".join(d.name for d in DIMENSIONS)

_RESERVE = (
    "UPDATE quota_counters SET reserved = reserved + ?1"
    " WHERE subject_type = ?2 AND subject_id = ?3 AND dimension = ?4 AND window_start = ?5"
    " AND (?1 = 0 OR spent + reserved + ?1 <= limit_value)"
    " RETURNING id, limit_value, spent, reserved"
)
_PEEK = (
    "SELECT limit_value, spent, reserved FROM quota_counters"
    " WHERE subject_type = ? AND subject_id = ? AND dimension = ? AND window_start = ?"
)
_UNRESERVE = "UPDATE quota_counters SET reserved = CASE WHEN reserved - ?1 < 1e-9 THEN 0 ELSE reserved - ?1 END WHERE id = ?2"

#: The limits of one key or team: (dimension, limit) for each dimension it has a limit on.
Limits = tuple[tuple[Dimension, float], ...]


@dataclass(frozen=True, slots=True)
class Hold:
    """A counter an admission reserved on, and how much."""

    counter_id: int
    dimension: Dimension
    amount: float


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


@dataclass(frozen=True, slots=True)
class Plan:
    """What an admission means to reserve on one counter."""

    subject: str
    subject_id: int
    dimension: Dimension
    window_start: float
    window_end: float
    limit: float
    amount: float


class Refused(Exception):
    """Inside an admission transaction: a counter cannot take ``plan.amount``, so nothing is reserved.

    It stays inside the metering package: the meter answers it with :class:`~appliance.errors.QuotaExceeded`
    or :class:`~appliance.errors.RateLimited`."""

    def __init__(self, plan: Plan):
        super().__init__(plan.dimension.name)
        self.plan = plan


@dataclass(frozen=True, slots=True)
class _Budget:
    """A token or cost counter as the completion cap sees it."""

    plan: Plan
    remaining: float
    per_token: float  # what one token takes from the counter


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


@dataclass(frozen=True, slots=True)
class Granted:
    """A reservation made: what it holds, the counters as it left them, and the completion cap (None: uncapped)."""

    holds: tuple[Hold, ...]
    states: list[CounterState]
    capped: int | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A reservation refused: the counter that cannot take it, and every planned counter as it stands."""

    plan: Plan
    plans: list[Plan]
    states: list[CounterState]


@dataclass(frozen=True, slots=True)
class Reservation:
    """An admission's work inside a write transaction: reserve on every planned counter, or on none.

    ``prompt`` is set when the completion is to be capped to the budgets left (see
    :func:`appliance.metering.quotas.completion_cap`). :meth:`apply` runs in the
    group-commit writer's batch (or a transaction of its own) inside a savepoint,
    so a refusal undoes its own partial reservation and nothing else.
    """

    request_id: str
    now: float
    plans: list[Plan]
    prompt: int | None
    max_tokens: int | None
    per_cost_token: float
    cache_counts: bool = True  # cached tokens count against token quotas (a counter made now starts from the ledger)

    def apply(self, conn: sqlite3.Connection) -> Granted | Refusal | None:
        """Reserve; None when the request id is already in flight."""
        conn.execute("SAVEPOINT admission")
        try:
            plans, capped = self.plans, None
            if self.prompt is not None:
                plans, capped = _capped(conn, self.plans, self.prompt, self.max_tokens, self.per_cost_token, self.cache_counts)
            holds, states = _reserve(conn, self.request_id, self.now, plans, self.cache_counts)
        except Refused as refused:
            conn.execute("ROLLBACK TO admission")
            conn.execute("RELEASE admission")
            states = [CounterState(p.dimension, p.subject, *_peek(conn, p, self.cache_counts), p.window_end) for p in self.plans]
            return Refusal(refused.plan, self.plans, states)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO admission")
            conn.execute("RELEASE admission")
            return None
        conn.execute("RELEASE admission")
        return Granted(holds, states, capped)


def busy(exc: sqlite3.OperationalError) -> EngineUnavailable:
    """The 503 for a metering database that stayed locked."""
    log.error("quota admission failed: %s", exc)
    return EngineUnavailable("The metering database is busy; retry shortly.", headers={"Retry-After": "1"})


def _capped(
    conn: sqlite3.Connection,
    plans: list[Plan],
    prompt: int,
    requested: int | None,
    per_cost_token: float,
    cache_counts: bool = True,
) -> tuple[list[Plan], int | None]:
    """Cap the completion to what every token and cost counter has left.

    Returns the plans with token and cost amounts set to prompt + cap, and the cap;
    raises :class:`Refused` if the prompt alone does not fit."""
    budgets = []
    for p in plans:
        if p.dimension.unit not in ("tokens", "cost"):
            continue
        limit, spent, reserved = _made(conn, p, cache_counts)
        budgets.append(_Budget(p, limit - spent - reserved, 1.0 if p.dimension.unit == "tokens" else per_cost_token))
    cap = completion_cap(prompt, requested, [(b.remaining, b.per_token) for b in budgets])
    if cap is None:
        return plans, None
    if cap < 1:
        # the tightest counter: the one the prompt plus one token overruns by most
        worst = max(
            (b for b in budgets if b.per_token > 0),
            key=lambda b: ((prompt + 1) * b.per_token - b.remaining) / max(b.per_token, 1e-300),
        )
        raise Refused(replace(worst.plan, amount=(prompt + 1) * worst.per_token))
    total = prompt + cap
    return [
        replace(p, amount=float(total) if p.dimension.unit == "tokens" else total * per_cost_token)
        if p.dimension.unit in ("tokens", "cost")
        else p
        for p in plans
    ], cap


def _reserve(
    conn: sqlite3.Connection, request_id: str, now: float, plans: list[Plan], cache_counts: bool = True
) -> tuple[tuple[Hold, ...], list[CounterState]]:
    holds, states = [], []
    for p in plans:
        args = (p.amount, p.subject, p.subject_id, p.dimension.name, p.window_start)
        row = conn.execute(_RESERVE, args).fetchone()
        if row is None and conn.execute(create_sql(p.subject, p.dimension, cache_counts), _window(p)).rowcount:
            row = conn.execute(_RESERVE, args).fetchone()
        if row is None:
            raise Refused(p)
        holds.append(Hold(row[0], p.dimension, p.amount))
        states.append(CounterState(p.dimension, p.subject, row[1], row[2], row[3], p.window_end))
    counters = json.dumps([[h.counter_id, h.amount] for h in holds])
    conn.execute("INSERT INTO reservations (request_id, counters, created_at) VALUES (?, ?, ?)", (request_id, counters, now))
    return tuple(holds), states


def _window(p: Plan) -> dict[str, object]:
    """The parameters of :func:`~appliance.metering.window_spend.create_sql` for a planned counter."""
    return {
        "subject_type": p.subject,
        "subject_id": p.subject_id,
        "dimension": p.dimension.name,
        "start": p.window_start,
        "end": p.window_end,
        "limit": p.limit,
    }


def _made(conn: sqlite3.Connection, p: Plan, cache_counts: bool) -> tuple[float, float, float]:
    """(limit, spent, reserved) of a planned counter, made first if missing (its spend read from the ledger once)."""
    row = conn.execute(_PEEK, (p.subject, p.subject_id, p.dimension.name, p.window_start)).fetchone()
    if row is not None:
        return row
    conn.execute(create_sql(p.subject, p.dimension, cache_counts), _window(p))
    return conn.execute(_PEEK, (p.subject, p.subject_id, p.dimension.name, p.window_start)).fetchone()


def _peek(conn: sqlite3.Connection, p: Plan, cache_counts: bool = True) -> tuple[float, float, float]:
    """(limit, spent, reserved) of a planned counter; a counter not made yet holds what the ledger has for its window."""
    row = conn.execute(_PEEK, (p.subject, p.subject_id, p.dimension.name, p.window_start)).fetchone()
    if row is not None:
        return row
    spent = conn.execute("SELECT " + spent_sql(p.subject, p.dimension, cache_counts), _window(p)).fetchone()[0]
    return (p.limit, float(spent), 0.0)


def release_reservations(conn: sqlite3.Connection, cutoff: float) -> int:
    """Inside a transaction: return what reservations made before ``cutoff`` hold, and delete them."""
    rows = conn.execute("DELETE FROM reservations WHERE created_at < ? RETURNING counters", (cutoff,)).fetchall()
    for (counters,) in rows:
        for counter_id, amount in json.loads(counters):
            conn.execute(_UNRESERVE, (amount, counter_id))
    return len(rows)


def prune_counters(conn: sqlite3.Connection, now: float) -> int:
    """Inside a transaction: delete counters of windows long over (the ledger keeps the history)."""
    n = 0
    for window, before in (("minute", now - 3600), ("day", now - 2 * DAY), ("month", now - 62 * DAY)):
        dims = [d.name for d in DIMENSIONS if d.window == window]
        marks = ", ".join("?" * len(dims))
        n += conn.execute(
            f"DELETE FROM quota_counters WHERE dimension IN ({marks}) AND window_start < ?", (*dims, before)
        ).rowcount
    return n
