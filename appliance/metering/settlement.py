"""Settlement: the usage row of a finished request, its charges on the counters it held, and the held amounts returned.

The meter turns a settle or release into a :class:`Settlement`; the group-commit
writer (:mod:`appliance.metering.ledger`) applies many of them in one
transaction with :func:`apply_settlement`. The reservation row says what is
still held, so a reservation already released as stale is never returned twice.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass
from typing import NamedTuple

from appliance.metering.alerts import raise_budget_alert
from appliance.metering.reservation import Hold

log = logging.getLogger("appliance.metering.settlement")

# Return a held amount; amounts below a billionth are float residue, not a reservation.
_SETTLE = (
    "UPDATE quota_counters SET spent = spent + ?1,"
    " reserved = CASE WHEN reserved - ?2 < 1e-9 THEN 0 ELSE reserved - ?2 END WHERE id = ?3"
)
_USAGE = (
    "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, variant, backend, prompt_tokens,"
    " completion_tokens, cached_tokens, ttft_ms, latency_ms, status, cache_tier, cost, energy_joules, batch_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

# A key's "last used" moves with its ledger rows, in the same group commit (never on the request path).
_LAST_USED = "UPDATE api_keys SET last_used_at = ?1 WHERE id = ?2 AND coalesce(last_used_at, 0) < ?1"


class UsageRow(NamedTuple):
    """One row of the ``usage`` ledger, in column order."""

    request_id: str
    created_at: float
    key_id: int | None
    team_id: int | None
    endpoint: str
    model: str
    variant: str | None
    backend: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_ms: float | None
    latency_ms: float
    status: int
    cache_tier: str
    cost: float
    energy_joules: float | None
    batch_id: str | None = None  # the batch a line of which this request was (None: an HTTP request)


@dataclass(slots=True)
class Settlement:
    """One settle or release, as the writer applies it."""

    row: UsageRow
    charges: tuple[tuple[int, float, bool], ...]  # (counter id, amount to add to spent, a budget counter)
    holds: bool
    cost: float
    alert_shares: tuple[float, ...] = ()  # budget alert thresholds (%) of quotas that set none (none: no alerts)


def charges(holds: tuple[Hold, ...], tokens: int, cost: float, counts_tokens: bool) -> tuple[tuple[int, float, bool], ...]:
    """What each held counter is charged: a request, the tokens (unless a cache hit does not count), the cost;
    and whether it is a budget (daily or monthly, the counters alerts watch)."""
    out = []
    for hold in holds:
        unit = hold.dimension.unit
        if unit == "requests":
            amount = 1.0
        elif unit == "tokens":
            amount = float(tokens) if counts_tokens else 0.0
        elif unit == "cost":
            amount = cost
        else:
            amount = 0.0
        out.append((hold.counter_id, amount, hold.dimension.budget))
    return tuple(out)


def apply_settlement(conn: sqlite3.Connection, settlement: Settlement) -> float:
    """Write one settle/release inside the writer's transaction; returns its cost."""
    held: dict[int, float] = {}
    if settlement.holds:
        row = conn.execute(
            "DELETE FROM reservations WHERE request_id = ? RETURNING counters", (settlement.row.request_id,)
        ).fetchone()
        if row is not None:
            held = {int(cid): float(amount) for cid, amount in json.loads(row[0])}
    for counter_id, spent, budget in settlement.charges:
        returned = held.get(counter_id, 0.0)
        if spent or returned:
            conn.execute(_SETTLE, (spent, returned, counter_id))
        if spent and budget:
            raise_budget_alert(conn, counter_id, settlement.row.created_at, settlement.alert_shares)
    insert_usage(conn, settlement.row)
    if settlement.row.key_id is not None:
        conn.execute(_LAST_USED, (settlement.row.created_at, settlement.row.key_id))
    return settlement.cost


def insert_usage(conn: sqlite3.Connection, row: UsageRow) -> None:
    """Insert a usage row; a clash or a dangling reference changes the row, never drops it."""
    try:
        conn.execute(_USAGE, row)
    except sqlite3.IntegrityError as exc:
        text = str(exc)
        if "usage.request_id" in text:
            n = conn.execute(
                "SELECT count(*) FROM usage WHERE request_id = ? OR request_id LIKE ?", (row.request_id, row.request_id + "~%")
            ).fetchone()[0]
            log.warning("duplicate request id in usage; recording it as %s~%d", row.request_id, n)
            insert_usage(conn, row._replace(request_id=f"{row.request_id}~{n}"))
        elif "FOREIGN KEY" in text:
            log.warning("usage row refers to a missing key or team; recording it without them")
            insert_usage(conn, row._replace(key_id=None, team_id=None))
        else:
            raise
