"""Per-instance admission: a bounded queue in front of the engine's slots.

Up to ``slots`` requests run at once. Further requests wait in a bounded
queue, interactive before batch (FIFO within a class). A full queue answers
429 at once; a request that waits longer than the queue timeout gets 503.
Both carry Retry-After, so a client never hangs.
"""

from __future__ import annotations

import asyncio
from collections import deque

from appliance.errors import EngineUnavailable, RateLimited

PRIORITIES = ("interactive", "batch")


class AdmissionQueue:
    def __init__(self, slots: int, max_waiting: int, timeout_s: float):
        self.slots = slots
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.active = 0
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {p: deque() for p in PRIORITIES}

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    async def acquire(self, priority: str = "interactive") -> None:
        if self.active < self.slots and not any(self._waiters.values()):
            self.active += 1
            return
        if self.waiting >= self.max_waiting:
            raise RateLimited("The model's queue is full; retry shortly.", code="queue_full", headers={"Retry-After": "1"})
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters.get(priority, self._waiters["interactive"])
        queue.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            if future.done() and not future.cancelled():
                self.release()  # the slot arrived just as we gave up: pass it on
            else:
                future.cancel()
                queue.remove(future)
            raise EngineUnavailable(
                f"Waited {self.timeout_s:.0f} s for a free slot; the box is saturated.",
                code="queue_timeout",
                headers={"Retry-After": "5"},
            ) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()
            elif future in queue:
                queue.remove(future)
            raise

    def release(self) -> None:
        """Hand the slot to the next waiter, interactive first; else free it."""
        for priority in PRIORITIES:
            queue = self._waiters[priority]
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    return
        self.active -= 1
