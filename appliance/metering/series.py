"""Time buckets and percentiles for usage reports: pure functions, no I/O.

A range up to two days long is shown by the hour, a longer one by the day; bucket
starts are UTC, as the ledger's ``day`` and ``hour`` groups are. Percentiles use
the nearest-rank definition: p95 is the smallest recorded value that at least 95%
of the values do not exceed, so it is always a value that was really measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

Bucket = Literal["hour", "day"]

HOUR = 3600
DAY = 86400
HOURLY_UP_TO_S = 2 * DAY


def bucket_for(since: float, until: float) -> Bucket:
    """The bucket a chart of ``[since, until)`` is drawn in: hours up to two days, days beyond."""
    return "hour" if until - since <= HOURLY_UP_TO_S else "day"


def bucket_label(start: float, bucket: Bucket) -> str:
    """The label the ledger's ``hour``/``day`` group gives the bucket starting at ``start``."""
    moment = datetime.fromtimestamp(start, UTC)
    return moment.strftime("%Y-%m-%dT%H:00:00Z") if bucket == "hour" else moment.strftime("%Y-%m-%d")


def bucket_starts(since: float, until: float, bucket: Bucket) -> list[float]:
    """Starts of the buckets that overlap ``[since, until)``, the first one aligned down to its bucket."""
    size = HOUR if bucket == "hour" else DAY
    first = math.floor(since / size) * size
    return [float(t) for t in range(int(first), int(math.ceil(until)), size)]


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank ``q``-th percentile (0 < q <= 100) of values sorted ascending; None for none."""
    if not ordered:
        return None
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    rank = math.ceil(q * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]
