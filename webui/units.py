"""Numbers as people read them on the console's charts: durations in ms or s, tokens and counts in k/M/B, money
in the configured currency. Pure functions, no I/O.

Each unit has two spellings: ``axis`` is short, for tick labels (``1.5k``, ``250 ms``, ``0.50 EUR``), ``exact``
keeps every digit that matters, for hover values and the tables screen readers get (``1,534 tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from appliance.webui.money import money

Unit = Literal["tokens", "count", "ms", "money"]
UNITS: tuple[Unit, ...] = ("tokens", "count", "ms", "money")

_SCALES = ((1e9, "B"), (1e6, "M"), (1e3, "k"))


def _trimmed(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def compact(value: float) -> str:
    """A count in at most three significant digits with k, M or B: ``950``, ``1.5k``, ``12k``, ``3.4M``."""
    v = float(value)
    for size, suffix in _SCALES:
        if abs(v) >= size * 0.9995:
            scaled = v / size
            return _trimmed(scaled, 1 if abs(scaled) < 10 else 0) + suffix
    if abs(v) >= 100:
        return f"{v:.0f}"
    return _trimmed(v, 1 if abs(v) >= 1 else 2)


def duration(ms: float) -> str:
    """A duration given in milliseconds: ``0 ms``, ``2.5 ms``, ``850 ms``, ``1.25 s``, ``12.3 s``, ``125 s``."""
    v = float(ms)
    if abs(v) < 10:
        return f"{_trimmed(v, 1)} ms"
    if abs(v) < 1000:
        return f"{v:.0f} ms"
    seconds = v / 1000
    if abs(seconds) < 10:
        return f"{_trimmed(seconds, 2)} s"
    if abs(seconds) < 100:
        return f"{_trimmed(seconds, 1)} s"
    return f"{seconds:,.0f} s"


def axis_formatter(unit: Unit, currency: str = "", *, alongside: float = 0.0) -> Callable[[float], str]:
    """How a tick label of ``unit`` reads; ``alongside`` (the top tick) sets the decimals of money so they line up."""
    if unit == "ms":  # one unit along an axis: 0 s, 10 s, 20 s rather than 0 ms, 10 s, 20 s
        return duration if alongside < 1000 else (lambda v: f"{_trimmed(float(v) / 1000, 2)} s")
    if unit == "money":
        return lambda v: f"{money(v, alongside)} {currency}".rstrip()
    return compact


def exact_formatter(unit: Unit, currency: str = "") -> Callable[[float], str]:
    """How a value of ``unit`` reads in full: a hover title or a table cell."""
    if unit == "ms":
        return duration
    if unit == "money":
        return lambda v: f"{money(v)} {currency}".rstrip()
    if unit == "tokens":
        return lambda v: f"{float(v):,.0f}"
    return lambda v: f"{float(v):,.0f}" if float(v) == int(float(v)) else f"{float(v):,.2f}"


def unit_name(unit: Unit, value: float) -> str:
    """The word after an exact count in a sentence: ``1 token``, ``3 tokens``; empty for units that carry their own."""
    if unit == "tokens":
        return "token" if float(value) == 1 else "tokens"
    return ""
