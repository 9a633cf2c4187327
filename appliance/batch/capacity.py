"""How many batch lines may run now: only in the slots interactive requests leave.

A line of model M may start when, on M's loaded instance, nothing waits in the admission queue and the busy
slots (batch lines included) stay below ``slots - batch_reserved_slots``; with nothing but batch lines running, one
line may always run (work-conserving on a quiet box). A model that is not loaded gets one line, which loads it.
All batches together keep at most ``batch_max_in_flight`` lines in flight. Batch lines also ask the admission queue
at ``batch`` priority, so a slot that frees while interactive requests wait goes to them first. While the share of
the last 5 minutes' interactive requests that met their latency targets is below ``batch_holdback_attainment``, no
line starts at all (``attainment``: :meth:`appliance.metering.box_figures.BoxFigures.interactive_attainment`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from appliance.errors import ApplianceError
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.settings import Settings


class Capacity:
    def __init__(
        self, settings: Settings, router: Router, names: ModelNames, attainment: Callable[[], float | None] | None = None
    ):
        self._settings = settings
        self._router = router
        self._names = names
        self._attainment = attainment  # interactive requests' latency-target attainment (None: none counted)
        self.in_flight: Counter[str] = Counter()  # batch lines running, by canonical model name

    @property
    def total(self) -> int:
        return sum(self.in_flight.values())

    def model_of(self, requested: str) -> str:
        """The canonical name a line's ``model`` resolves to (the requested name when it does not resolve: the line
        will fail in the gateway, quickly)."""
        try:
            return self._names.resolve(requested).name
        except ApplianceError:
            return requested

    def may_start(self, model: str) -> bool:
        if self.total >= self._settings.batch_max_in_flight or self.holding_back():
            return False
        mine = self.in_flight[model]
        instance = self._router.instances.get(model)
        if instance is None:
            return mine == 0
        queue = instance.queue
        if queue.waiting:
            return False
        others = max(0, queue.active - mine)
        limit = queue.slots - self._settings.batch_reserved_slots - others
        if others == 0:
            limit = max(1, limit)
        return mine < limit

    def holding_back(self) -> bool:
        """Whether interactive requests miss their latency targets too often for batch lines to start."""
        if self._attainment is None or self._settings.batch_holdback_attainment <= 0:
            return False
        share = self._attainment()
        return share is not None and share < self._settings.batch_holdback_attainment

    def acquire(self, model: str) -> None:
        self.in_flight[model] += 1

    def release(self, model: str) -> None:
        self.in_flight[model] -= 1
        if self.in_flight[model] <= 0:
            del self.in_flight[model]
