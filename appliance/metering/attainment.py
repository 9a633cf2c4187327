"""Latency-target attainment ("goodput") per model and priority class, from the usage ledger.

A request counts when an engine answered it (cache hits would flatter the engines) and either succeeded (status
below 400, with a recorded time to first token) or failed on the box's side (5xx: a miss). Client errors and
requests the client left (4xx, 499) are not the box's to keep. A counted request is *within* its targets when its
TTFT is at most its class's ``ttft_p95_s`` and its TPOT -- (latency - TTFT) / (completion tokens - 1), defined for
two tokens or more -- at most ``tpot_p95_s``; a one-token answer is judged on TTFT alone.

The class is ``batch`` for the rows of batch lines (``usage.batch_id``), else the key's priority (``interactive``
when the row has no key). Rows come from :func:`ledger_rows`, one bounded query on ``ix_usage_created``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from appliance.metering.series import percentile

CLASSES = ("interactive", "batch")
WINDOWS: dict[str, float] = {"5m": 300.0, "1h": 3600.0, "1d": 86400.0}
#: Requests that started this long before a window still overlap it (for busy time); longer ones are clipped.
LOOKBACK_S = 900.0

Targets = Mapping[Any, Mapping[Any, float]]  # class -> {"ttft_p95_s": s, "tpot_p95_s": s} (the settings key them by Literal)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """The columns of one usage row that attainment and the box's economics read."""

    created_at: float
    model: str
    klass: str
    ttft_ms: float | None
    latency_ms: float | None
    completion_tokens: int
    status: int
    cache_tier: str = "miss"
    energy_joules: float | None = None

    @property
    def engine(self) -> bool:
        return self.cache_tier == "miss"

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first; None below two tokens or without timings."""
        if self.completion_tokens < 2 or self.ttft_ms is None or self.latency_ms is None:
            return None
        return max(0.0, self.latency_ms - self.ttft_ms) / 1000.0 / (self.completion_tokens - 1)


@dataclass(frozen=True, slots=True)
class Attainment:
    requests: int
    within: int
    ttft_p95_s: float | None
    tpot_p95_s: float | None

    @property
    def share(self) -> float:
        return self.within / self.requests if self.requests else 1.0


def counted(row: LedgerRow) -> bool:
    """Whether ``row`` is the box's to keep its targets on (see the module's docstring)."""
    if not row.engine:
        return False
    if row.status >= 500:
        return True
    return row.status < 400 and row.ttft_ms is not None


def within_targets(row: LedgerRow, targets: Targets) -> bool:
    if row.status >= 500 or row.ttft_ms is None:
        return False
    target = targets.get(row.klass) or targets.get("interactive") or {}
    if row.ttft_ms / 1000.0 > target.get("ttft_p95_s", float("inf")):
        return False
    tpot = row.tpot_s
    return tpot is None or tpot <= target.get("tpot_p95_s", float("inf"))


def attainment(rows: Iterable[LedgerRow], targets: Targets, since: float) -> dict[tuple[str, str], Attainment]:
    """Per (model, class): requests started at or after ``since`` counted, those within targets, and the p95s."""
    counts: dict[tuple[str, str], list[int]] = {}
    ttfts: dict[tuple[str, str], list[float]] = {}
    tpots: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row.created_at < since or not counted(row):
            continue
        key = (row.model, row.klass)
        tally = counts.setdefault(key, [0, 0])
        tally[0] += 1
        tally[1] += within_targets(row, targets)
        if row.ttft_ms is not None:
            ttfts.setdefault(key, []).append(row.ttft_ms / 1000.0)
        tpot = row.tpot_s
        if tpot is not None:
            tpots.setdefault(key, []).append(tpot)
    return {
        key: Attainment(n, ok, percentile(sorted(ttfts.get(key, [])), 95), percentile(sorted(tpots.get(key, [])), 95))
        for key, (n, ok) in counts.items()
    }


def class_share(found: Mapping[tuple[str, str], Attainment], klass: str) -> float | None:
    """Attainment of one class over all models; None when no request of it counted."""
    n = sum(a.requests for (_, c), a in found.items() if c == klass)
    return sum(a.within for (_, c), a in found.items() if c == klass) / n if n else None


_ROWS = text(
    "SELECT u.created_at, u.model, CASE WHEN u.batch_id IS NOT NULL THEN 'batch' ELSE coalesce(k.priority, 'interactive') END,"
    " u.ttft_ms, u.latency_ms, u.completion_tokens, u.status, u.cache_tier, u.energy_joules"
    " FROM usage u LEFT JOIN api_keys k ON k.id = u.key_id WHERE u.created_at >= :since AND u.created_at < :until"
)


def ledger_rows(db: Engine, since: float, until: float) -> list[LedgerRow]:
    """The ledger rows that started in [since - LOOKBACK_S, until): one range scan of ``ix_usage_created``."""
    with db.connect() as conn:
        found = conn.execute(_ROWS, {"since": since - LOOKBACK_S, "until": until}).all()
    return [
        LedgerRow(float(t), str(m), str(c), ttft, latency, int(tokens or 0), int(status), str(tier), energy)
        for t, m, c, ttft, latency, tokens, status, tier, energy in found
    ]
