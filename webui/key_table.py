"""The keys and teams tables' figures: limits, what each limit's window has used, and spend this month.

Spend comes from the usage ledger over the current calendar month (UTC), the
same rows ``/admin/usage`` sums, so the two always agree; what is left of a
monthly limit comes from the quota counters the admission check uses (spend plus
reservations of requests still running), or the whole limit when no request has
used the window yet. Each limit is shown with its window's use as
``QuotaService.get_quota`` reports it (the counter's spend, which starts from the
ledger when a limit is set mid-window) and its state: ``over`` when the window
spent more than the limit (set or lowered after the spending), ``reached`` when
nothing more fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Engine

from appliance.jsontypes import JsonObject
from appliance.metering.quotas import Windows
from appliance.metering.reports import query_usage

MONTHLY = (("tokens_per_month", "tokens"), ("cost_per_month", "cost"))


@dataclass(frozen=True, slots=True)
class KeySpend:
    """A key's use in the current month, and what its monthly limits leave (None: no such limit)."""

    requests: int
    tokens: int
    cost: float
    tokens_left: float | None
    cost_left: float | None


@dataclass(frozen=True, slots=True)
class LimitView:
    """One limit of a key or team, and its current window's use."""

    name: str  # the dimension, e.g. tokens_per_day
    limit: float
    spent: float  # used in the current window (requests, tokens or cost; 0 for max_concurrent)
    reserved: float  # held by requests in flight
    state: str  # ok | reached | over


def limit_views(quota: JsonObject) -> list[LimitView]:
    """The limits set in a ``QuotaService.get_quota`` answer, in dimension order, each with its window's use."""
    limits, counters = quota["limits"], quota["usage"]
    views = []
    for name, limit in limits.items():
        if limit is None:
            continue
        counter = counters.get(name) or {}
        views.append(
            LimitView(
                name,
                float(limit),
                float(counter.get("spent") or 0.0),
                float(counter.get("reserved") or 0.0),
                str(counter.get("state") or "ok"),
            )
        )
    return views


def month_start(now: float | None = None) -> float:
    """Start (epoch seconds) of the calendar month the monthly quota windows count."""
    start, _end = Windows().bounds("month", time.time() if now is None else now)
    return start


def month_spend(db: Engine, now: float | None = None) -> dict[int, JsonObject]:
    """Usage of each key since the start of this month, from the ledger: ``{key_id: row}``."""
    report = query_usage(db, since=month_start(now), by=("key",), now=now)
    return {int(row["key_id"]): row for row in report["rows"] if row["key_id"] is not None}


def key_spend(row: JsonObject | None, quota: JsonObject) -> KeySpend:
    """A key's :class:`KeySpend` from its ledger row (None: no use this month) and its ``QuotaService.get_quota``."""
    limits, counters = quota["limits"], quota["usage"]
    left: dict[str, float | None] = {}
    for dimension, _unit in MONTHLY:
        limit = limits.get(dimension)
        counter = counters.get(dimension)
        left[dimension] = None if limit is None else (float(counter["remaining"]) if counter else float(limit))
    row = row or {}
    return KeySpend(
        requests=int(row.get("requests") or 0),
        tokens=int(row.get("total_tokens") or 0),
        cost=float(row.get("cost") or 0.0),
        tokens_left=left["tokens_per_month"],
        cost_left=left["cost_per_month"],
    )
