"""Where a time chart puts its gridlines and tick labels: pure functions, no I/O.

Values get "nice" steps (1, 2, 2.5 or 5 times a power of ten) from zero to the first step at or above the largest
value, so gridlines read as round numbers. Time gets ticks on whole hours, days, weeks (Mondays) or months (their
first day), at the smallest interval that keeps the labels few enough to read on a phone; all times are UTC,
as the usage ledger's buckets are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from appliance.metering.series import DAY, HOUR, Bucket

NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)
HOUR_STEPS = (1, 2, 3, 6, 12)
DAY_STEPS = (1, 2)
MONTH_STEPS = (1, 2, 3, 6, 12)
MAX_TIME_TICKS = 7


def value_ticks(high: float, count: int = 4, *, whole: bool = False) -> list[float]:
    """Gridline values from 0 up to the first nice step at or above ``high``, about ``count`` steps apart;
    ``whole`` for things counted one by one (requests, tokens): no step below 1."""
    top = max(float(high), 0.0)
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    steps = [power * n for n in NICE_STEPS if power * n >= raw * (1 - 1e-9)]
    if whole:
        steps = [s for s in steps if s >= 1 and abs(s - round(s)) < 1e-9] or [1.0]
    step = steps[0]
    last = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(last + 1)]


@dataclass(frozen=True, slots=True)
class TimeTick:
    """A labelled moment on the time axis: the bucket it starts (its index) and what the label says."""

    index: int
    label: str


def _moment(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _day(moment: datetime) -> str:
    return f"{moment:%b} {moment.day}"


def _hour_ticks(starts: Sequence[float], limit: int) -> list[TimeTick]:
    for step in HOUR_STEPS:
        picked = [i for i, t in enumerate(starts) if int(t // HOUR) % step == 0]
        if len(picked) <= limit:
            break
    else:  # more than two days by the hour: one tick a day
        picked = [i for i, t in enumerate(starts) if int(t) % DAY == 0]
    ticks = []
    for i in picked:
        moment = _moment(starts[i])
        ticks.append(TimeTick(i, _day(moment) if moment.hour == 0 else f"{moment:%H}:00"))
    return ticks


def _day_ticks(starts: Sequence[float], limit: int) -> list[TimeTick]:
    days = [_moment(t) for t in starts]
    for step in DAY_STEPS:
        picked = [i for i, d in enumerate(days) if int(starts[i] // DAY) % step == 0]
        if len(picked) <= limit:
            return [TimeTick(i, _day(days[i])) for i in picked]
    mondays = [i for i, d in enumerate(days) if d.weekday() == 0]
    if len(mondays) <= limit:
        return [TimeTick(i, _day(days[i])) for i in mondays]
    firsts = [i for i, d in enumerate(days) if d.day == 1]
    for step in MONTH_STEPS:
        picked = [i for i in firsts if (days[i].month - 1) % step == 0]
        if len(picked) <= limit:
            break
    else:  # decades: one tick a year, every few years
        years = [i for i in firsts if days[i].month == 1]
        every = math.ceil(len(years) / limit)
        picked = [i for i in years if days[i].year % every == 0]
    return [TimeTick(i, f"{days[i]:%b %Y}" if days[i].month == 1 or n == 0 else f"{days[i]:%b}") for n, i in enumerate(picked)]


def time_ticks(starts: Sequence[float], bucket: Bucket, limit: int = MAX_TIME_TICKS) -> list[TimeTick]:
    """Ticks for buckets starting at ``starts`` (UTC, oldest first): at most ``limit``, on round moments."""
    if not starts:
        return []
    return _hour_ticks(starts, limit) if bucket == "hour" else _day_ticks(starts, limit)


@dataclass(frozen=True, slots=True)
class TimeAxis:
    """The buckets a time chart is drawn over: their starts (UTC, oldest first) and whether they are hours or days."""

    starts: tuple[float, ...]
    bucket: Bucket

    def label(self, index: int) -> str:
        """The bucket's name in full, for hover values and tables: ``2026-12-05 14:00`` or ``2026-12-05``."""
        moment = _moment(self.starts[index])
        return f"{moment:%Y-%m-%d %H}:00" if self.bucket == "hour" else f"{moment:%Y-%m-%d}"

    @property
    def labels(self) -> list[str]:
        return [self.label(i) for i in range(len(self.starts))]

    def ticks(self, limit: int = MAX_TIME_TICKS) -> list[TimeTick]:
        return time_ticks(self.starts, self.bucket, limit)
