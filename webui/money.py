"""Amounts of the currency as people read them: a small budget reads right (0.0055 of 0.0500, not 0.0 of 0.0)."""

from __future__ import annotations

import math

from appliance.metering.reports import COST_DECIMALS


def money_decimals(*amounts: float) -> int:
    """Cents for amounts of 1 and up; below that three significant digits of the largest, up to a millionth."""
    top = max((abs(float(a)) for a in amounts), default=0.0)
    if top >= 1 or top == 0:
        return 2
    return max(2, min(COST_DECIMALS, 2 - math.floor(math.log10(top))))


def money(value: float, *alongside: float) -> str:
    """``value`` with the decimals that suit it and the amounts shown beside it (a row's limit), so they line up."""
    return f"{float(value):.{money_decimals(value, *alongside)}f}"
