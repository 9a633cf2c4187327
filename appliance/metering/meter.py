"""The meter: admit (reserve quota), then settle or release (usage row + quota settle).

Request path, as the gateway drives it::

    admission = meter.admit(principal, request_id=..., endpoint=..., model=..., estimated_tokens=...)
    ...forward...
    cost = await meter.settle(admission, model=..., prompt_tokens=..., ...)   # or meter.release(...)

``admit`` is synchronous and cheap. A principal without quotas costs two dict
look-ups (the "no quota" fact is cached per key and team, and dropped when a quota
changes). With quotas it runs one short ``BEGIN IMMEDIATE`` transaction holding
one conditional UPDATE per counter::

    UPDATE quota_counters SET reserved = reserved + :x
     WHERE <subject, dimension, window> AND spent + reserved + :x <= limit_value

so no interleaving of admissions, in this process or another, can overspend.
The counters held and the amounts are written to ``reservations`` in the same
transaction. ``settle``/``release`` write the usage row, add the real amounts to
``spent`` and return the held amounts from ``reserved`` in ONE transaction, via
the group-commit writer (:mod:`appliance.metering.ledger`); they return once it is
committed. The reservation row, not memory, says what is still held, so a
reservation released as stale is never returned twice.

The meter counts quota refusals in ``metrics`` (it alone knows the dimension);
the request counters and histograms are the gateway's to feed, through
``meter.metrics.observe_request``, once per request whatever its outcome.

All of it uses one dedicated SQLite connection guarded by a lock shared by the
event loop (admit) and the writer thread (settle): the two never wait on
SQLite's busy handler for each other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from sqlalchemy import Engine

from appliance.accounts.keys import Principal
from appliance.db.engine import _on_connect
from appliance.errors import Conflict, EngineUnavailable, QuotaExceeded, RateLimited
from appliance.metering.ledger import GroupCommitWriter, transaction
from appliance.metrics import Metrics
from appliance.metering.pricing import PER, PriceBook, cost_of
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
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.meter")

CACHE_HIT_TIERS = frozenset({"exact", "semantic"})
QUOTA_CACHE_SECONDS = 30.0
_QUOTA_COLUMNS = ", ".join(d.name for d in DIMENSIONS)

_RESERVE = (
    "UPDATE quota_counters SET reserved = reserved + ?1"
    " WHERE subject_type = ?2 AND subject_id = ?3 AND dimension = ?4 AND window_start = ?5"
    " AND (?1 = 0 OR spent + reserved + ?1 <= limit_value)"
    " RETURNING id, limit_value, spent, reserved"
)
_CREATE = (
    "INSERT OR IGNORE INTO quota_counters (subject_type, subject_id, dimension, window_start, limit_value, spent, reserved)"
    " VALUES (?, ?, ?, ?, ?, 0, 0)"
)
_PEEK = (
    "SELECT limit_value, spent, reserved FROM quota_counters"
    " WHERE subject_type = ? AND subject_id = ? AND dimension = ? AND window_start = ?"
)
# Return a held amount; amounts below a billionth are float residue, not a reservation.
_SETTLE = (
    "UPDATE quota_counters SET spent = spent + ?1,"
    " reserved = CASE WHEN reserved - ?2 < 1e-9 THEN 0 ELSE reserved - ?2 END WHERE id = ?3"
)
_UNRESERVE = "UPDATE quota_counters SET reserved = CASE WHEN reserved - ?1 < 1e-9 THEN 0 ELSE reserved - ?1 END WHERE id = ?2"
_USAGE = (
    "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, variant, backend, prompt_tokens,"
    " completion_tokens, cached_tokens, ttft_ms, latency_ms, status, cache_tier, cost, energy_joules)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


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


@dataclass(slots=True)
class _Record:
    """One settle or release, as the writer applies it."""

    row: tuple
    charges: tuple[tuple[int, float], ...]  # (counter id, amount to add to spent)
    holds: bool
    cost: float


@dataclass(frozen=True, slots=True)
class _Plan:
    subject: str
    subject_id: int
    dimension: Dimension
    window_start: float
    window_end: float
    limit: float
    amount: float


class _Refused(Exception):
    def __init__(self, plan: _Plan):
        self.plan = plan


def _apply(conn: sqlite3.Connection, record: _Record) -> float:
    """Write one settle/release inside the writer's transaction."""
    held: dict[int, float] = {}
    if record.holds:
        row = conn.execute("DELETE FROM reservations WHERE request_id = ? RETURNING counters", (record.row[0],)).fetchone()
        if row is not None:
            held = {int(cid): float(amount) for cid, amount in json.loads(row[0])}
    for counter_id, spent in record.charges:
        returned = held.get(counter_id, 0.0)
        if spent or returned:
            conn.execute(_SETTLE, (spent, returned, counter_id))
    _insert_usage(conn, record.row)
    return record.cost


def _insert_usage(conn: sqlite3.Connection, row: tuple) -> None:
    """Insert a usage row; a clash or a dangling reference changes the row, never drops it."""
    try:
        conn.execute(_USAGE, row)
    except sqlite3.IntegrityError as exc:
        text = str(exc)
        if "usage.request_id" in text:
            n = conn.execute("SELECT count(*) FROM usage WHERE request_id = ? OR request_id LIKE ?", (row[0], row[0] + "~%")).fetchone()[0]
            log.warning("duplicate request id in usage; recording it as %s~%d", row[0], n)
            _insert_usage(conn, (f"{row[0]}~{n}", *row[1:]))
        elif "FOREIGN KEY" in text:
            log.warning("usage row refers to a missing key or team; recording it without them")
            _insert_usage(conn, (*row[:2], None, None, *row[4:]))
        else:
            raise


def connect(db: Engine) -> sqlite3.Connection:
    """The meter's own connection to the database file behind ``db``, with the same pragmas."""
    path = db.url.database
    if not path or path == ":memory:":
        raise ValueError("the meter needs a database file")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    _on_connect(conn, None)
    return conn


class Meter:
    """Quota admission, usage ledger and cost, for the gateway."""

    def __init__(
        self,
        settings: Settings,
        db: Engine,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.db = db
        self.metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._conn = connect(db)
        self._lock = threading.RLock()
        self._windows = Windows()
        self._limits: dict[tuple[str, int], tuple[float, tuple[tuple[Dimension, float], ...]]] = {}
        self._generation = 0  # bumped by invalidate_quotas, so a read racing a change is not cached
        self.prices = PriceBook(self._load_prices)
        self._writer = GroupCommitWriter(self._conn, self._lock, _apply)

    # -- lifecycle -----------------------------------------------------------------
    @property
    def stale_after_s(self) -> float:
        """Age after which a reservation can only be a leftover (no request lives this long)."""
        return self.settings.request_timeout_seconds + self.settings.queue_timeout_seconds + 60.0

    @property
    def writer_stats(self):
        return self._writer.stats

    async def start(self, *, release_reservations: bool = True) -> None:
        """Start the group-commit writer; release every reservation a crashed daemon left.

        Only one daemon runs per data dir (lock file), so at start every reservation is
        a leftover. Pass ``release_reservations=False`` when several meters share a
        database on purpose (tests)."""
        if release_reservations:
            released = self._release(math.inf)
            if released:
                log.info("released %d reservations left by an earlier run", released)
        self._writer.start()

    async def stop(self) -> None:
        """Write everything pending and stop the writer. Later settles write synchronously."""
        await asyncio.to_thread(self._writer.stop)

    def close(self) -> None:
        self._writer.stop()
        self._conn.close()

    # -- quota cache -----------------------------------------------------------------
    def invalidate_quotas(self) -> None:
        """Forget cached limits (call after any quota change)."""
        self._generation += 1
        self._limits.clear()

    def _subject_limits(self, subject: str, subject_id: int) -> tuple[tuple[Dimension, float], ...]:
        entry = self._limits.get((subject, subject_id))
        now = time.monotonic()
        if entry is not None and entry[0] > now:
            return entry[1]
        generation = self._generation
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_QUOTA_COLUMNS} FROM quotas WHERE subject_type = ? AND subject_id = ?", (subject, subject_id)
            ).fetchone()
        limits = tuple((d, float(v)) for d, v in zip(DIMENSIONS, row or ()) if v is not None)
        if generation == self._generation:
            self._limits[(subject, subject_id)] = (now + QUOTA_CACHE_SECONDS, limits)
        return limits

    def _load_prices(self) -> list[tuple[str, float, float, float]]:
        with self._lock:
            return self._conn.execute("SELECT model, input_per_m, output_per_m, cached_per_m FROM prices").fetchall()

    # -- admission -----------------------------------------------------------------
    def admit(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        estimated_tokens: int,
        cached: bool = False,
        cap: bool = False,
        max_tokens: int | None = None,
    ) -> Admission:
        """Reserve on every quota of the key and its team, or raise 429 (QuotaExceeded/RateLimited).

        With ``cap``, ``estimated_tokens`` is an upper bound of the prompt and ``max_tokens``
        the completion asked for (``None``: as much as the engine will give). In the same
        transaction as the reservation, the completion is capped to the allowance left on
        every token and cost counter of the key and its team; the reservation is prompt +
        cap and ``admission.max_tokens`` is the cap to send to the engine. A prompt that
        alone does not fit is refused (429) before any engine work."""
        key_id = principal.id if principal.kind == "key" else None
        team_id = principal.team_id
        now = self._clock()
        admission = Admission(request_id, endpoint, model, key_id, team_id, estimated_tokens, cached, now)
        key_limits = self._subject_limits("key", key_id) if key_id is not None else ()
        team_limits = self._subject_limits("team", team_id) if team_id is not None else ()
        if not key_limits and not team_limits:
            return admission
        plans = self._plan(now, model, estimated_tokens, cached, (("key", key_id, key_limits), ("team", team_id, team_limits)))
        capped: list[int | None] = [None]

        def work():
            todo = plans
            if cap and not cached:
                todo = self._cap(plans, model, max(0, estimated_tokens), max_tokens, capped)
            return self._reserve(request_id, now, todo)

        try:
            holds, states = transaction(self._conn, self._lock, work)
        except _Refused as refused:
            self._refuse(refused.plan, plans, now, model)
        except sqlite3.IntegrityError:
            raise Conflict(f"Request id {request_id!r} is already in flight.") from None
        except sqlite3.OperationalError as exc:
            log.error("quota admission failed: %s", exc)
            raise EngineUnavailable("The metering database is busy; retry shortly.", headers={"Retry-After": "1"}) from None
        admission.holds = holds
        admission.headers = ratelimit_headers(states, now)
        if capped[0] is not None:
            admission.max_tokens = capped[0]
            admission.estimated_tokens = max(0, estimated_tokens) + capped[0]
        return admission

    def _cap(self, plans: list[_Plan], model: str, prompt: int, requested: int | None, out: list[int | None]) -> list[_Plan]:
        """Inside the admission transaction: cap the completion to what every token and cost counter has left.

        Returns the plans with token and cost amounts set to prompt + cap; raises
        :class:`_Refused` if the prompt alone does not fit."""
        per_cost_token = self.prices.highest_rate(model) / PER
        budgeted = []
        for p in plans:
            if p.dimension.unit not in ("tokens", "cost"):
                continue
            per_token = 1.0 if p.dimension.unit == "tokens" else per_cost_token
            row = self._conn.execute(_PEEK, (p.subject, p.subject_id, p.dimension.name, p.window_start)).fetchone()
            limit, spent, reserved = row if row is not None else (p.limit, 0.0, 0.0)
            budgeted.append((p, limit - spent - reserved, per_token))
        cap = completion_cap(prompt, requested, [(remaining, per) for _, remaining, per in budgeted])
        if cap is None:
            return plans
        if cap < 1:
            # the tightest counter: the one the prompt plus one token overruns by most
            worst = max((b for b in budgeted if b[2] > 0), key=lambda b: ((prompt + 1) * b[2] - b[1]) / max(b[2], 1e-300))
            raise _Refused(replace(worst[0], amount=(prompt + 1) * worst[2]))
        out[0] = cap
        total = prompt + cap
        return [replace(p, amount=float(total) if p.dimension.unit == "tokens" else total * per_cost_token)
                if p.dimension.unit in ("tokens", "cost") else p for p in plans]

    def _plan(self, now: float, model: str, estimated_tokens: int, cached: bool, subjects) -> list[_Plan]:
        tokens = 0 if cached and not self.settings.cache_counts_against_quota else max(0, estimated_tokens)
        plans = []
        for subject, subject_id, limits in subjects:
            for dimension, limit in limits:
                if dimension.unit == "tokens":
                    amount = float(tokens)
                elif dimension.unit == "cost":
                    rate = self.prices.rate(model).cached_per_m if cached else self.prices.highest_rate(model)
                    amount = max(0, estimated_tokens) * rate / PER
                else:  # a request, or a concurrency slot
                    amount = 1.0
                start, end = self._windows.bounds(dimension.window, now)
                plans.append(_Plan(subject, subject_id, dimension, start, end, limit, amount))
        return plans

    def _reserve(self, request_id: str, now: float, plans: list[_Plan]) -> tuple[tuple[Hold, ...], list[CounterState]]:
        conn = self._conn
        holds, states = [], []
        for p in plans:
            args = (p.amount, p.subject, p.subject_id, p.dimension.name, p.window_start)
            row = conn.execute(_RESERVE, args).fetchone()
            if row is None and conn.execute(_CREATE, (p.subject, p.subject_id, p.dimension.name, p.window_start, p.limit)).rowcount:
                row = conn.execute(_RESERVE, args).fetchone()
            if row is None:
                raise _Refused(p)
            holds.append(Hold(row[0], p.dimension, p.amount))
            states.append(CounterState(p.dimension, p.subject, row[1], row[2], row[3], p.window_end))
        counters = json.dumps([[h.counter_id, h.amount] for h in holds])
        conn.execute("INSERT INTO reservations (request_id, counters, created_at) VALUES (?, ?, ?)", (request_id, counters, now))
        return tuple(holds), states

    def _refuse(self, refused: _Plan, plans: list[_Plan], now: float, model: str) -> None:
        states, refused_state = [], None
        with self._lock:
            for p in plans:
                row = self._conn.execute(_PEEK, (p.subject, p.subject_id, p.dimension.name, p.window_start)).fetchone()
                limit, spent, reserved = row if row is not None else (p.limit, 0.0, 0.0)
                state = CounterState(p.dimension, p.subject, limit, spent, reserved, p.window_end)
                states.append(state)
                if (p.subject, p.subject_id, p.dimension) == (refused.subject, refused.subject_id, refused.dimension):
                    refused_state = state
        assert refused_state is not None
        headers = ratelimit_headers(states, now)
        headers["Retry-After"] = retry_after(refused_state, now)
        self.metrics.observe_refusal(model, refused.dimension.name)
        error = QuotaExceeded if refused.dimension.budget else RateLimited
        raise error(refusal_message(refused_state, refused.amount), headers=headers)

    # -- settling --------------------------------------------------------------------
    async def settle(
        self,
        admission: Admission,
        *,
        model: str,
        variant: str | None,
        backend: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        ttft_ms: float | None,
        latency_ms: float,
        status: int,
        cache_tier: str = "miss",
        energy_joules: float | None = None,
    ) -> float:
        """Record the usage row and settle the quota in one committed transaction; return the cost."""
        if admission.finished:
            return admission.cost or 0.0
        admission.finished = True
        hit = cache_tier in CACHE_HIT_TIERS
        rate = self.prices.rate(model, variant)
        cost = cost_of(rate, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens, cache_hit=hit)
        row = (admission.request_id, admission.admitted_at, admission.key_id, admission.team_id, admission.endpoint, model, variant,
               backend, prompt_tokens, completion_tokens, cached_tokens, ttft_ms, latency_ms, status, cache_tier, cost, energy_joules)
        admission.cost = cost
        return await self._commit(admission, row, prompt_tokens + completion_tokens, hit, cost)

    async def release(
        self,
        admission: Admission,
        *,
        status: int,
        model: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """A failed or abandoned request: record what it produced, charge that, free the rest."""
        if admission.finished:
            return
        admission.finished = True
        latency_ms = (time.perf_counter() - admission.started) * 1000.0
        cost = cost_of(self.prices.rate(model), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=0, cache_hit=False)
        row = (admission.request_id, admission.admitted_at, admission.key_id, admission.team_id, admission.endpoint, model, None,
               None, prompt_tokens, completion_tokens, 0, None, latency_ms, status, "miss", cost, None)
        admission.cost = cost
        await self._commit(admission, row, prompt_tokens + completion_tokens, False, cost)

    async def _commit(self, admission: Admission, row: tuple, tokens: int, hit: bool, cost: float) -> float:
        counts_tokens = not hit or self.settings.cache_counts_against_quota
        charges = []
        for hold in admission.holds:
            unit = hold.dimension.unit
            if unit == "requests":
                amount = 1.0
            elif unit == "tokens":
                amount = float(tokens) if counts_tokens else 0.0
            elif unit == "cost":
                amount = cost
            else:
                amount = 0.0
            charges.append((hold.counter_id, amount))
        record = _Record(row, tuple(charges), bool(admission.holds), cost)
        if self._writer.running:
            try:
                return await self._writer.submit(record)
            except RuntimeError:  # stopping right now: write it ourselves
                pass
        (result, error), = self._writer.write_now([record])
        if error is not None:
            raise error
        return result

    # -- housekeeping -------------------------------------------------------------------
    def release_stale(self, older_than_s: float | None = None) -> int:
        """Release reservations older than ``older_than_s`` (default: :attr:`stale_after_s`).

        Schedule it every minute. Returns how many were released."""
        age = self.stale_after_s if older_than_s is None else older_than_s
        return self._release(self._clock() - age)

    def _release(self, cutoff: float) -> int:
        def work() -> int:
            rows = self._conn.execute("DELETE FROM reservations WHERE created_at < ? RETURNING counters", (cutoff,)).fetchall()
            for (counters,) in rows:
                for counter_id, amount in json.loads(counters):
                    self._conn.execute(_UNRESERVE, (amount, counter_id))
            return len(rows)

        return transaction(self._conn, self._lock, work)

    def prune_counters(self) -> int:
        """Delete counters of windows long over (the ledger keeps the history). Schedule hourly."""
        now = self._clock()
        minute_dims = [d.name for d in DIMENSIONS if d.window == "minute"]
        day_dims = [d.name for d in DIMENSIONS if d.window == "day"]
        month_dims = [d.name for d in DIMENSIONS if d.window == "month"]

        def work() -> int:
            n = 0
            for dims, before in ((minute_dims, now - 3600), (day_dims, now - 2 * DAY), (month_dims, now - 62 * DAY)):
                marks = ", ".join("?" * len(dims))
                n += self._conn.execute(
                    f"DELETE FROM quota_counters WHERE dimension IN ({marks}) AND window_start < ?", (*dims, before)
                ).rowcount
            return n

        return transaction(self._conn, self._lock, work)
