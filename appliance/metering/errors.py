"""Errors of the metering package that stay inside it (what a client sees is in :mod:`appliance.errors`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appliance.metering.admission import Plan


class Refused(Exception):
    """Inside an admission transaction: a counter cannot take ``plan.amount``, so nothing is reserved.

    The meter answers it with :class:`~appliance.errors.QuotaExceeded` or :class:`~appliance.errors.RateLimited`."""

    def __init__(self, plan: Plan):
        super().__init__(plan.dimension.name)
        self.plan = plan
