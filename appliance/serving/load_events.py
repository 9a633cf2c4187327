"""Model loads as a stream of typed events: what a load is doing, its plan, and how it ended.

The router publishes every load's phases here, whoever started it (the
console's Load button, the admin API, or a request for a model that was not
loaded): ``planning``, ``starting`` (with the plan: backend, variant, context,
placement, estimated memory), then ``loaded`` (with the memory the engine
really took) or ``failed`` (with the reason). Readers either ask for the
latest event of each model (a page being rendered) or follow new events as
they happen (the console's SSE stream). Built once by the composition root and
handed to the router and to the console by dependency injection.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from appliance.planner.types import Plan

PHASES = ("planning", "starting", "loaded", "failed", "evicted")
FINISHED = frozenset({"loaded", "failed", "evicted"})
_FOLLOWER_BACKLOG = 256


@dataclass(frozen=True, slots=True)
class LoadPlanSummary:
    """The parts of a plan a person watching a load wants to see."""

    backend: str
    variant: str
    context: int
    parallel: int
    devices: tuple[str, ...]
    n_gpu_layers: int
    estimated_bytes: int
    reason: str

    @classmethod
    def of(cls, plan: Plan) -> LoadPlanSummary:
        return cls(
            backend=plan.backend,
            variant=plan.variant,
            context=plan.context,
            parallel=plan.parallel,
            devices=tuple(plan.devices),
            n_gpu_layers=plan.n_gpu_layers,
            estimated_bytes=plan.estimated_bytes,
            reason=plan.reason,
        )

    @property
    def placement(self) -> str:
        """Where the layers go, in words: ``all layers on cuda:0``, ``CPU only``, ``12 layers on cuda:0, rest on CPU``."""
        gpus = [d for d in self.devices if d != "cpu"]
        if not gpus or self.n_gpu_layers == 0:
            return "CPU only"
        where = ", ".join(gpus)
        if self.n_gpu_layers < 0:
            return f"all layers on {where}"
        return f"{self.n_gpu_layers} layers on {where}, the rest on the CPU"


@dataclass(frozen=True, slots=True)
class LoadEvent:
    """One phase of one model's load."""

    model: str  # family:variant
    phase: str  # one of PHASES
    started_at: float  # wall-clock time the load began
    at: float = field(default_factory=time.time)
    plan: LoadPlanSummary | None = None
    rss_bytes: int | None = None  # resident memory of the engine's process tree once loaded
    gpu_bytes: int | None = None  # GPU memory charged to the engine's processes, where the driver reports it
    error: str | None = None
    evicted_by: str | None = None  # the model whose load stopped this one (phase ``evicted``)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    @property
    def step(self) -> int:
        """1-based position of the phase in a load that succeeds (failed counts as the last step)."""
        return min(PHASES.index(self.phase) + 1, 3)

    @property
    def clock(self) -> str:
        """When it happened, as a wall clock reads it (UTC, as everywhere in the console): ``14:02 UTC``."""
        return dt.datetime.fromtimestamp(self.at, dt.UTC).strftime("%H:%M UTC")

    @property
    def seconds(self) -> float:
        return max(0.0, self.at - self.started_at)

    @property
    def measured_bytes(self) -> int | None:
        if self.rss_bytes is None and self.gpu_bytes is None:
            return None
        return (self.rss_bytes or 0) + (self.gpu_bytes or 0)


class LoadEvents:
    """Publishes load events to followers and remembers each model's latest one."""

    def __init__(self) -> None:
        self._latest: dict[str, LoadEvent] = {}
        self._followers: set[asyncio.Queue[LoadEvent]] = set()

    def publish(self, event: LoadEvent) -> None:
        self._latest[event.model] = event
        for queue in list(self._followers):
            if queue.full():  # a follower that stopped reading loses its oldest event, never blocks a load
                queue.get_nowait()
            queue.put_nowait(event)

    def latest(self, model: str) -> LoadEvent | None:
        return self._latest.get(model)

    def in_progress(self) -> list[LoadEvent]:
        return [e for e in self._latest.values() if not e.finished]

    def evicted(self, model: str, *, by: str) -> None:
        """``model`` was stopped to make room for loading ``by``: its row says so until it is loaded again."""
        now = time.time()
        self.publish(LoadEvent(model, "evicted", now, at=now, evicted_by=by))

    def forget(self, model: str) -> None:
        """Drop what is remembered of ``model`` (it was unloaded or deleted)."""
        self._latest.pop(model, None)

    def follow(self) -> LoadFollower:
        """A reader of every event published from now on, in order; close it when done."""
        follower = LoadFollower(self._followers)
        self._followers.add(follower.queue)
        return follower


class LoadFollower:
    """Events published since it was made, in order (a slow reader loses the oldest beyond a backlog)."""

    def __init__(self, followers: set[asyncio.Queue[LoadEvent]]):
        self.queue: asyncio.Queue[LoadEvent] = asyncio.Queue(_FOLLOWER_BACKLOG)
        self._followers = followers

    def __aiter__(self) -> AsyncIterator[LoadEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[LoadEvent]:
        while True:
            yield await self.queue.get()

    def close(self) -> None:
        self._followers.discard(self.queue)
