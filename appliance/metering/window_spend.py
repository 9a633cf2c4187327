"""What a key or team has spent in one quota window, read from the usage ledger.

A quota counter holds ``spent`` for one window. A counter made in the middle of its
window (the first admission after a limit was set, or a limit set or lowered while
the window runs) must start from what the ledger already holds for that window, or a
key that spent 466 tokens today and is then given 400 a day would start again from
zero. Both places that make or refresh a counter take its ``spent`` from the scalar
subquery built here, inside their own write transaction, so the value is exactly the
ledger's: a settlement commits its usage row and its charge on the counter together.

What one row adds is what :func:`appliance.metering.settlement.charges` charges a
counter for it: one request, its prompt and completion tokens (none for a cache hit
when cached tokens do not count against quotas), its cost. Concurrency counters hold
no spend.

The SQL is built only from the fixed fragments below; every value is a named
parameter (``:subject_id``, ``:start``, ``:end``), so the same text runs on the
meter's sqlite3 connection and through SQLAlchemy's ``text()``.
"""

from __future__ import annotations

from appliance.metering.quotas import Dimension

CACHE_HIT_TIERS = ("exact", "semantic")

_SUBJECT_COLUMN = {"key": "key_id", "team": "team_id"}
_TOKENS = "prompt_tokens + completion_tokens"
_SUMS = {
    "requests": "count(*)",
    "cost": "coalesce(sum(cost), 0)",
    "tokens": f"coalesce(sum({_TOKENS}), 0)",
    "tokens_not_cached": f"coalesce(sum(CASE WHEN cache_tier IN ('exact', 'semantic') THEN 0 ELSE {_TOKENS} END), 0)",
}


def spent_sql(subject: str, dimension: Dimension, cache_counts: bool, rows: str = "") -> str:
    """``(SELECT ...)``: what ``subject`` (key | team) spent on ``dimension`` between ``:start`` and ``:end``.

    ``rows`` narrows the ledger rows read: ``"upto"`` (``id <= :upto``) or ``"after"`` (``id > :upto``).
    0 for a concurrency counter (it never accumulates spend)."""
    if dimension.window is None:
        return "0"
    unit = dimension.unit
    if unit == "tokens" and not cache_counts:
        unit = "tokens_not_cached"
    column = _SUBJECT_COLUMN[subject]
    if rows == "after":  # the ledger's tail by rowid range: the unary + keeps the planner off the (subject, time) index
        where = f"id > :upto AND +{column} = :subject_id AND +created_at >= :start AND +created_at < :end"
    else:
        where = f"{column} = :subject_id AND created_at >= :start AND created_at < :end"
        where += " AND id <= :upto" if rows == "upto" else ""
    return f"(SELECT {_SUMS[unit]} FROM usage WHERE {where})"


def create_sql(subject: str, dimension: Dimension, cache_counts: bool) -> str:
    """Make the counter of one window if it is missing, its ``spent`` taken from the ledger (nothing reserved yet).

    Parameters: ``:subject_type``, ``:subject_id``, ``:dimension``, ``:start``, ``:end``, ``:limit``."""
    return (
        "INSERT OR IGNORE INTO quota_counters (subject_type, subject_id, dimension, window_start, limit_value, spent, reserved)"
        f" VALUES (:subject_type, :subject_id, :dimension, :start, :limit, {spent_sql(subject, dimension, cache_counts)}, 0)"
    )


def sync_sql(subject: str, dimension: Dimension, cache_counts: bool) -> str:
    """Make or refresh the counter of one window: the new limit, and ``spent`` as the ledger has it.

    The ledger is append-only and its ids grow in commit order, so the bulk of the sum can be read
    before the write transaction (:func:`spent_sql` with ``rows="upto"``, up to the largest id then
    committed, passed as ``:upto``, its sum as ``:base``); inside, only rows after ``:upto`` are read.
    The write lock is then held for the few rows committed in between, not for a month of ledger.

    What requests in flight hold (``reserved``) is kept: their charges are added when they settle,
    and their usage rows are not in the ledger yet. Parameters of :func:`create_sql`, and ``:upto``, ``:base``."""
    after = spent_sql(subject, dimension, cache_counts, "after")
    return (
        "INSERT INTO quota_counters (subject_type, subject_id, dimension, window_start, limit_value, spent, reserved)"
        f" VALUES (:subject_type, :subject_id, :dimension, :start, :limit, :base + {after}, 0)"
        " ON CONFLICT (subject_type, subject_id, dimension, window_start)"
        " DO UPDATE SET limit_value = excluded.limit_value, spent = excluded.spent"
    )


def window_state(limit: float, spent: float, reserved: float, concurrency: bool) -> str:
    """``ok``, ``reached`` (nothing more fits: the next request is refused) or ``over`` (more spent than the limit).

    A concurrency counter is ``reached`` while its slots are all taken; it is never ``over`` by spending."""
    if concurrency:
        return "reached" if reserved >= limit else "ok"
    if spent > limit:
        return "over"
    return "reached" if spent >= limit else "ok"
