"""Reservation: an admission's work inside a write transaction, on every quota counter it plans, or on none.

It holds one conditional UPDATE per counter::

    UPDATE quota_counters SET reserved = reserved + :x
     WHERE <subject, dimension, window> AND spent + reserved + :x <= limit_value

inside a savepoint, so no interleaving of admissions, in this process or another,
can overspend, and a refusal undoes only its own partial reservation. The counters
held and the amounts are written to ``reservations`` in the same transaction; that
row, not memory, says what is still held. A counter made by an admission starts from
what the ledger holds for its window (:mod:`appliance.metering.window_spend`), so a
limit set mid-window counts what the window already spent.

Housekeeping lives here too: reservations left behind are returned, counters of windows long over deleted.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, replace

from appliance.metering.quotas import DAY, DIMENSIONS, CounterState, Dimension, completion_cap
from appliance.metering.window_spend import create_sql, spent_sql

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


@dataclass(frozen=True, slots=True)
class Hold:
    """A counter an admission reserved on, and how much."""

    counter_id: int
    dimension: Dimension
    amount: float


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
