"""Quota dimensions, their windows, and the rate-limit headers built from counters.

Pure functions only: the meter (``appliance.metering.meter``) does the database work.

Windows are fixed and aligned in UTC: a minute, a day, a calendar month.
``max_concurrent`` has no window: its one counter (``window_start`` 0) holds the
requests in flight as ``reserved`` and never accumulates ``spent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

MINUTE = 60.0
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Dimension:
    name: str  # also the Quota column and the QuotaCounter.dimension
    window: str | None  # minute | day | month | None (concurrency)
    unit: str  # requests | tokens | cost | concurrent
    budget: bool  # a spent budget (QuotaExceeded) rather than a rate (RateLimited)


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("requests_per_minute", "minute", "requests", False),
    Dimension("tokens_per_minute", "minute", "tokens", False),
    Dimension("tokens_per_day", "day", "tokens", True),
    Dimension("tokens_per_month", "month", "tokens", True),
    Dimension("cost_per_month", "month", "cost", True),
    Dimension("max_concurrent", None, "concurrent", False),
)
BY_NAME = {d.name: d for d in DIMENSIONS}
TOKEN_DIMENSIONS = tuple(d for d in DIMENSIONS if d.unit == "tokens")


def month_bounds(t: float) -> tuple[float, float]:
    start = datetime.fromtimestamp(t, UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start.timestamp(), end.timestamp()


class Windows:
    """Window starts and ends for an instant; caches the month, which needs calendar maths."""

    __slots__ = ("_month",)

    def __init__(self) -> None:
        self._month = (0.0, 0.0)

    def bounds(self, window: str | None, t: float) -> tuple[float, float]:
        """(start, end) of the window holding ``t``; concurrency counters use (0, inf)."""
        if window == "minute":
            start = (t // MINUTE) * MINUTE
            return start, start + MINUTE
        if window == "day":
            start = (t // DAY) * DAY
            return start, start + DAY
        if window == "month":
            start, end = self._month
            if not start <= t < end:
                start, end = self._month = month_bounds(t)
            return start, end
        return 0.0, math.inf


@dataclass(frozen=True, slots=True)
class CounterState:
    """One counter as seen by an admission: what the headers are made from."""

    dimension: Dimension
    subject: str  # key | team
    limit: float
    spent: float
    reserved: float
    window_end: float

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.spent - self.reserved)


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``6s``, ``1m30s``, ``26h0m0s``."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _tightest(states: list[CounterState]) -> CounterState | None:
    return min(states, key=lambda s: (s.remaining, s.limit)) if states else None


def ratelimit_headers(states: list[CounterState], now: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers from the tightest request and token counters.

    Tokens report tokens/minute when such a limit applies (as OpenAI does), else the
    tightest of the day and month token budgets.
    """
    headers: dict[str, str] = {}
    requests = _tightest([s for s in states if s.dimension.name == "requests_per_minute"])
    tokens = _tightest([s for s in states if s.dimension.name == "tokens_per_minute"]) or _tightest(
        [s for s in states if s.dimension.unit == "tokens"]
    )
    for kind, state in (("requests", requests), ("tokens", tokens)):
        if state is not None:
            headers[f"x-ratelimit-limit-{kind}"] = _number(state.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = _number(math.floor(state.remaining))
            headers[f"x-ratelimit-reset-{kind}"] = format_duration(state.window_end - now)
    return headers


def retry_after(state: CounterState, now: float) -> str:
    """Seconds until the refused counter frees up: its window's end, or 1 s for concurrency."""
    if state.dimension.window is None:
        return "1"
    return str(max(1, math.ceil(state.window_end - now)))


def _use(state: CounterState) -> str:
    """What a counter's window holds: used, and reserved by requests in flight where any is."""
    used = f"{_number(state.spent)} used"
    if state.reserved > 0:
        used += f" and {_number(state.reserved)} reserved by requests in flight"
    return used


def refusal_message(state: CounterState, amount: float) -> str:
    """Why a counter refused ``amount``: the limit, what the window used, what requests in flight reserve."""
    what = state.dimension.name.replace("_", " ")
    owner = "this key" if state.subject == "key" else "the key's team"
    limit = _number(state.limit)
    if amount > state.limit:
        return f"Request too large for the {what} limit of {owner}: needs {_number(amount)}, limit {limit}."
    if state.dimension.window is None:
        return f"Too many concurrent requests for {owner} (limit {limit}, {_number(state.reserved)} in flight)."
    if state.dimension.budget:
        if state.spent > state.limit:
            return f"The {what} budget of {owner} is over its limit: {_use(state)} of {limit}."
        if state.spent >= state.limit:
            return f"The {what} budget of {owner} is spent: {_use(state)} of {limit}."
        return (
            f"The {what} budget of {owner} cannot hold this request: {_use(state)} of {limit}, "
            f"{_number(state.remaining)} left; it needs {_number(amount)}."
        )
    return f"Rate limit reached for {owner}: {what} limit {limit} ({_use(state)}); it needs {_number(amount)}."


def completion_cap(prompt_tokens: int, requested: int | None, allowances: list[tuple[float, float]]) -> int | None:
    """The most completion tokens a request may generate within what is left.

    ``allowances`` holds, for each token or cost counter of the key and its team,
    ``(remaining, per_token)``: what is left of the limit and what one token takes
    from it (1 for a token counter, the price of one token for a cost counter; a
    free model takes nothing from a cost counter). The answer is the largest ``c``
    no greater than ``requested`` such that ``(prompt_tokens + c) * per_token <=
    remaining`` on every counter; ``None`` when nothing bounds it. Below 1 the
    prompt alone does not fit.
    """
    cap = requested
    for remaining, per_token in allowances:
        if per_token <= 0:
            continue
        room = remaining / per_token - prompt_tokens
        most = math.floor(room) if math.isfinite(room) else None
        if most is None:
            continue
        # float rounding: never more than fits, never less
        while most > 0 and (prompt_tokens + most) * per_token > remaining:
            most -= 1
        while (prompt_tokens + most + 1) * per_token <= remaining:
            most += 1
        cap = most if cap is None else min(cap, most)
    return cap
