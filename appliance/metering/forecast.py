"""Budget forecasts: at the rate spent so far in a window, when each daily or monthly budget runs out."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

from appliance.metering.alerts import label_of_row, labelled
from appliance.metering.quotas import DIMENSIONS, Windows

_BUDGETS = {d.name: d for d in DIMENSIONS if d.budget}
_NAMES, _COUNTERS_LABELLED = labelled("quota_counters", "c")
#: Spending younger than this says too little about a rate to forecast from.
MIN_ELAPSED_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class BudgetForecast:
    subject: str
    dimension: str
    window_start: float
    window_end: float
    limit: float
    spent: float
    reached_at: float | None  # when the limit is reached at the current rate; None: not within this window

    @property
    def used_percent(self) -> float:
        return 100.0 * self.spent / self.limit if self.limit else 100.0


def reached_at(spent: float, limit: float, window_start: float, window_end: float, now: float) -> float | None:
    """When ``spent`` reaches ``limit`` if spending goes on at its average rate since the window began.

    ``now`` when it already has; None when the window ends first, or nothing (or too little time) says what the rate is."""
    if spent >= limit:
        return now
    elapsed = now - window_start
    if spent <= 0 or elapsed < MIN_ELAPSED_SECONDS:
        return None
    at = now + (limit - spent) * elapsed / spent
    return at if at < window_end else None


def budget_forecasts(db: Engine, now: float) -> list[BudgetForecast]:
    """A forecast for every key and team budget with a counter in its current window."""
    windows = Windows()
    current = {name: windows.bounds(d.window, now) for name, d in _BUDGETS.items()}
    params: dict[str, object] = {}
    for i, (name, (start, _)) in enumerate(current.items()):
        params[f"d{i}"], params[f"w{i}"] = name, start
    clauses = " OR ".join(f"(c.dimension = :d{i} AND c.window_start = :w{i})" for i in range(len(current)))
    with db.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT c.subject_type, c.subject_id, c.dimension, c.limit_value, c.spent, {_NAMES} FROM {_COUNTERS_LABELLED}"
                f" WHERE c.limit_value > 0 AND ({clauses}) ORDER BY c.spent / c.limit_value DESC"
            ),
            params,
        ).all()
    out = []
    for subject_type, subject_id, dimension, limit, spent, *names in rows:
        start, end = current[dimension]
        out.append(
            BudgetForecast(
                label_of_row(subject_type, subject_id, *names),
                dimension,
                start,
                end,
                limit,
                spent,
                reached_at(spent, limit, start, end, now),
            )
        )
    return out
