"""The meter as a batch line's gateway sees it: the line's settle or release waits until its result is recorded.

The gateway settles a request (usage row + quota) before it hands the answer back. For a batch line, the answer
must be kept first, so that after a crash the line is either recorded *and* in the ledger, or in neither (see
:mod:`appliance.batch.store`). :class:`LineMeter` passes everything through to the real meter except
:meth:`settle` and :meth:`release` called while a line holds a :class:`HeldLedger`: those are kept and run by
the runner, with the batch's id and price factor, once the result is pending on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from appliance.metering.admission import Admission
from appliance.metering.meter import Meter


@dataclass
class HeldLedger:
    """The settle or release of one batch line, held until :meth:`write` runs it."""

    batch_id: str
    price_factor: float
    calls: list[tuple[Callable[..., Awaitable[object]], Admission, dict]] = field(default_factory=list)

    @property
    def request_id(self) -> str | None:
        return self.calls[-1][1].request_id if self.calls else None

    async def write(self) -> None:
        """Run the held calls (shielded: a cancelled line still settles what it used)."""
        calls, self.calls = self.calls, []
        for call, admission, kwargs in calls:
            await asyncio.shield(call(admission, batch_id=self.batch_id, price_factor=self.price_factor, **kwargs))


#: The line the current task runs (set by the runner around each gateway call).
held_ledger: ContextVar[HeldLedger | None] = ContextVar("held_ledger", default=None)


class LineMeter:
    def __init__(self, meter: Meter):
        self._meter = meter

    def __getattr__(self, name: str) -> object:
        return getattr(self._meter, name)

    async def settle(self, admission: Admission, **kwargs: object) -> float:
        held = held_ledger.get()
        if held is None:
            return await self._meter.settle(admission, **kwargs)  # type: ignore[arg-type]
        held.calls.append((self._meter.settle, admission, kwargs))
        return 0.0

    async def release(self, admission: Admission, **kwargs: object) -> None:
        held = held_ledger.get()
        if held is None:
            await self._meter.release(admission, **kwargs)  # type: ignore[arg-type]
            return
        held.calls.append((self._meter.release, admission, kwargs))
