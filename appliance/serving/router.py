"""Resolved variants to loaded instances: load on demand, eviction, idle unload.

Names are resolved before they get here (``appliance.serving.names``): the
router receives the :class:`ResolvedVariant` and keys instances by its
canonical ``family:variant`` name. A variant that is not loaded is planned and
started on first use. At most ``max_loaded_instances`` run at
once (and, when set, within the memory budget): to make room, idle unpinned
instances are evicted least-recently-used first; pinned ones never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from appliance.errors import ApplianceError, EngineUnavailable
from appliance.jsontypes import JsonObject
from appliance.planner.types import Plan
from appliance.serving.admission import AdmissionQueue
from appliance.serving.engine_client import EngineClient
from appliance.serving.load_events import LoadEvent, LoadEvents, LoadPlanSummary
from appliance.settings import Settings
from appliance.store.store import ResolvedVariant

log = logging.getLogger("appliance.serving.router")


class EngineLike(Protocol):
    name: str
    state: str
    client: EngineClient
    pid: int | None

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def wait_ready(self, timeout: float) -> None: ...
    def rss_bytes(self) -> int | None: ...
    def route(self, endpoint: str) -> str: ...


@dataclass
class Instance:
    """A loaded model: its engine, its admission queue and its bookkeeping."""

    name: str  # family:variant
    plan: Plan
    engine: EngineLike
    queue: AdmissionQueue
    pinned: bool = False
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    inflight: int = 0
    requests: int = 0

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and self.queue.waiting == 0

    def summary(self) -> JsonObject:
        return {
            "model": self.name,
            "backend": self.plan.backend,
            "state": self.engine.state,
            "pinned": self.pinned,
            "inflight": self.inflight,
            "waiting": self.queue.waiting,
            "slots": self.queue.slots,
            "requests": self.requests,
            "loaded_at": self.loaded_at,
            "idle_seconds": round(time.monotonic() - self.last_used, 1),
            "context": self.plan.context,
            "estimated_bytes": self.plan.estimated_bytes,
            "rss_bytes": self.engine.rss_bytes(),
            "pid": self.engine.pid,
        }


def _reason(exc: BaseException) -> str:
    """Why a load failed, in the words its error gives (a cancelled load says so)."""
    if isinstance(exc, ApplianceError):
        return exc.message
    if isinstance(exc, asyncio.CancelledError):
        return "The load was cancelled."
    return str(exc) or type(exc).__name__


class Router:
    def __init__(
        self,
        settings: Settings,
        *,
        make_plan: Callable[[ResolvedVariant], Plan],
        make_engine_process: Callable[[str, Plan], EngineLike],
        on_loaded: Callable[[Instance], Awaitable[None]] | None = None,
        on_stopping: Callable[[Instance], Awaitable[None]] | None = None,
        events: LoadEvents | None = None,
        gpu_bytes: Callable[[EngineLike, Plan], int | None] | None = None,
    ):
        """
        make_plan: plans a load of the installed variant on this box; raises DoesNotFit.
        make_engine_process: builds (not starts) the engine process for a plan.
        on_loaded: called after a load succeeds (calibration, audit).
        on_stopping: called before an instance's engine is stopped (speed calibration).
        events: where each load's phases are published (planning, starting, loaded, failed).
        gpu_bytes: the GPU memory a loaded engine holds, where it can be measured (the ``loaded`` event).
        """
        self.settings = settings
        self._make_plan = make_plan
        self._make_engine_process = make_engine_process
        self._on_loaded = on_loaded
        self._on_stopping = on_stopping
        self.events = events or LoadEvents()
        self._gpu_bytes = gpu_bytes
        self.instances: dict[str, Instance] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._capacity = asyncio.Lock()

    def is_loaded(self, name: str) -> bool:
        return name in self.instances

    async def load(self, target: ResolvedVariant, *, pin: bool | None = None) -> Instance:
        name = target.name
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            instance = self.instances.get(name)
            if instance is None:
                instance = await self._start(target)
            if pin is not None:
                instance.pinned = pin
            return instance

    async def _start(self, target: ResolvedVariant) -> Instance:
        """Plan and start ``target``, publishing each phase of the load (``self.events``)."""
        name = target.name
        began = time.time()
        self.events.publish(LoadEvent(name, "planning", began))
        summary: LoadPlanSummary | None = None
        try:
            plan = self._make_plan(target)
            summary = LoadPlanSummary.of(plan)
            self.events.publish(LoadEvent(name, "starting", began, plan=summary))
            instance = await self._spawn(name, plan)
        except BaseException as exc:
            self.events.publish(LoadEvent(name, "failed", began, plan=summary, error=_reason(exc)))
            raise
        engine = instance.engine
        self.events.publish(
            LoadEvent(
                name,
                "loaded",
                began,
                plan=summary,
                rss_bytes=engine.rss_bytes(),
                gpu_bytes=self._gpu_bytes(engine, plan) if self._gpu_bytes else None,
            )
        )
        log.info("loaded %s in %.1f s", name, time.time() - began, extra={"fields": {"model": name, "backend": plan.backend}})
        if self._on_loaded:
            try:
                await self._on_loaded(instance)
            except Exception:
                log.exception("post-load hook failed for %s", name)
        return instance

    async def _spawn(self, name: str, plan: Plan) -> Instance:
        async with self._capacity:
            await self._make_room(plan, name)
            engine = self._make_engine_process(name, plan)
            instance = Instance(
                name=name,
                plan=plan,
                engine=engine,
                queue=AdmissionQueue(plan.parallel, self.settings.queue_size, self.settings.queue_timeout_seconds),
            )
            await engine.start()
            self.instances[name] = instance
        return instance

    def _budget_bytes(self) -> int | None:
        budget = self.settings.memory_budget_gib
        return int(budget * 2**30) if budget else None

    def _over(self, loaded: list[Instance], needed: int) -> bool:
        """Whether a load needing ``needed`` bytes must evict one of ``loaded`` first."""
        if len(loaded) >= self.settings.max_loaded_instances:
            return True
        budget = self._budget_bytes()
        return budget is not None and sum(i.plan.estimated_bytes for i in loaded) + needed > budget

    def eviction_order(self) -> list[Instance]:
        """The instances a load may evict, first victim first: idle and unpinned, least recently used first."""
        return sorted((i for i in self.instances.values() if not i.pinned and i.idle), key=lambda i: i.last_used)

    def would_evict(self, name: str, needed: int = 0) -> list[Instance]:
        """What loading ``name`` (needing about ``needed`` bytes) would evict if it started now; none when it is loaded."""
        if name in self.instances:
            return []
        loaded, order, victims = list(self.instances.values()), self.eviction_order(), []
        while order and self._over(loaded, needed):
            victims.append(order.pop(0))
            loaded.remove(victims[-1])
        return victims

    async def _make_room(self, plan: Plan, name: str) -> None:
        """Evict idle, unpinned instances (least recently used first) until the plan for ``name`` fits."""
        while self._over(list(self.instances.values()), plan.estimated_bytes):
            candidates = self.eviction_order()
            if not candidates:
                raise EngineUnavailable(
                    "No room to load another model: every loaded model is pinned or busy.",
                    code="no_capacity",
                    headers={"Retry-After": "10"},
                )
            victim = candidates[0]
            log.info("evicting %s to load %s", victim.name, name, extra={"fields": {"model": victim.name, "for": name}})
            await self._stop(victim)
            self.events.evicted(victim.name, by=name)

    async def _stop(self, instance: Instance) -> None:
        self.instances.pop(instance.name, None)
        self.events.forget(instance.name)
        if self._on_stopping:
            try:
                await self._on_stopping(instance)
            except Exception:
                log.exception("pre-stop hook failed for %s", instance.name)
        await instance.engine.stop()

    async def unload(self, name: str) -> bool:
        """Stop the instance of the canonical ``family:variant`` ``name``; False if it was not loaded."""
        instance = self.instances.get(name)
        if instance is None:
            return False
        async with self._locks.setdefault(name, asyncio.Lock()):
            await self._stop(instance)
        return True

    def pin(self, name: str, pinned: bool) -> Instance:
        instance = self.instances.get(name)
        if instance is None:
            raise EngineUnavailable(f"{name} is not loaded; load it first.", code="not_loaded")
        instance.pinned = pinned
        return instance

    async def unload_idle(self, idle_seconds: float) -> list[str]:
        """Unload unpinned instances idle for longer than ``idle_seconds`` (scheduled job)."""
        now = time.monotonic()
        unloaded = []
        for instance in list(self.instances.values()):
            if not instance.pinned and instance.idle and now - instance.last_used > idle_seconds:
                await self._stop(instance)
                unloaded.append(instance.name)
                log.info("unloaded idle %s", instance.name, extra={"fields": {"model": instance.name}})
        return unloaded

    @contextlib.asynccontextmanager
    async def lease(self, target: ResolvedVariant, priority: str = "interactive") -> AsyncIterator[Instance]:
        """Load if needed, wait for a slot, and hold it for the request's duration."""
        instance = self.instances.get(target.name) or await self.load(target)
        await instance.engine.wait_ready(self.settings.queue_timeout_seconds)
        instance.last_used = time.monotonic()
        await instance.queue.acquire(priority)
        instance.inflight += 1
        instance.requests += 1
        try:
            yield instance
        finally:
            instance.inflight -= 1
            instance.last_used = time.monotonic()
            instance.queue.release()

    async def stop_all(self) -> None:
        for instance in list(self.instances.values()):
            await self._stop(instance)
