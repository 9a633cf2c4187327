"""Router policy (eviction order, pins, idle unload) over stand-in engines.

The integration suite (tests/integration/test_gateway_router.py) shows the
same behaviours against the real daemon and real llama.cpp engines.
"""

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from appliance.errors import EngineUnavailable, ModelNotFound
from appliance.serving.router import Router


@dataclass
class Plan:
    backend: str = "llamacpp"
    parallel: int = 2
    estimated_bytes: int = 100
    context: int = 512
    variant: str = "q4"
    devices: tuple = ("cpu",)
    n_gpu_layers: int = 0
    reason: str = "stand-in plan"


class StandInEngine:
    def __init__(self, name: str, log: list):
        self.name, self.state, self.client, self.pid, self.log = name, "stopped", None, None, log

    async def start(self):
        self.state = "ready"
        self.log.append(("start", self.name))

    async def stop(self):
        self.state = "stopped"
        self.log.append(("stop", self.name))

    async def wait_ready(self, timeout):
        return None

    def rss_bytes(self):
        return None


KNOWN = ("a:q4", "b:q4", "c:q4")


def resolve(name: str) -> SimpleNamespace:
    """A stand-in for ModelNames.resolve: the router only ever sees resolved variants."""
    full = name if ":" in name else f"{name}:q4"
    if full not in KNOWN:
        raise ModelNotFound(f"The model `{name}` does not exist.")
    return SimpleNamespace(name=full)


def make_router(max_loaded=2, budget_gib=None):
    log: list = []
    settings = SimpleNamespace(
        max_loaded_instances=max_loaded, memory_budget_gib=budget_gib, queue_size=4, queue_timeout_seconds=1
    )
    router = Router(settings, make_plan=lambda target: Plan(), make_engine_process=lambda n, p: StandInEngine(n, log))
    return router, log


async def test_load_on_demand_and_lru_eviction():
    router, log = make_router(max_loaded=2)
    async with router.lease(resolve("a")):
        pass
    async with router.lease(resolve("b")):
        pass
    async with router.lease(resolve("a")):  # a is now more recent than b
        pass
    async with router.lease(resolve("c")):
        pass
    assert set(router.instances) == {"a:q4", "c:q4"}
    assert ("stop", "b:q4") in log


async def test_pinned_and_busy_instances_are_never_evicted():
    router, _ = make_router(max_loaded=2)
    await router.load(resolve("a"), pin=True)
    async with router.lease(resolve("b")):
        with pytest.raises(EngineUnavailable) as info:
            await router.load(resolve("c"))
    assert info.value.status == 503 and info.value.headers.get("Retry-After")
    assert set(router.instances) == {"a:q4", "b:q4"}


async def test_memory_budget_evicts(monkeypatch):
    router, _ = make_router(max_loaded=5, budget_gib=150 / 2**30)  # room for one 100-byte plan
    await router.load(resolve("a"))
    await router.load(resolve("b"))
    assert set(router.instances) == {"b:q4"}


async def test_idle_unload_skips_pinned_and_busy():
    router, _ = make_router(max_loaded=3)
    await router.load(resolve("a"))
    await router.load(resolve("b"), pin=True)
    await asyncio.sleep(0.02)
    assert await router.unload_idle(0.01) == ["a:q4"]
    assert set(router.instances) == {"b:q4"}


async def test_concurrent_first_requests_load_once():
    router, log = make_router()

    async def use():
        async with router.lease(resolve("a")):
            await asyncio.sleep(0.01)

    await asyncio.gather(*(use() for _ in range(5)))
    assert log.count(("start", "a:q4")) == 1


async def test_unknown_model():
    router, _ = make_router()
    with pytest.raises(ModelNotFound):
        async with router.lease(resolve("nope")):
            pass


async def test_the_pre_stop_hook_sees_the_engine_still_running():
    """Speed calibration reads the engine's counters before it stops; a failing hook never blocks the stop."""
    log: list = []
    settings = SimpleNamespace(max_loaded_instances=1, memory_budget_gib=None, queue_size=4, queue_timeout_seconds=1)

    async def before_stop(instance):
        log.append(("hook", instance.name, instance.engine.state))
        raise RuntimeError("stats unreadable")

    router = Router(
        settings, make_plan=lambda target: Plan(), make_engine_process=lambda n, p: StandInEngine(n, log), on_stopping=before_stop
    )
    await router.load(resolve("a"))
    await router.load(resolve("b"))  # evicts a
    await router.unload("b:q4")
    assert [e for e in log if e[0] != "start"] == [
        ("hook", "a:q4", "ready"),
        ("stop", "a:q4"),
        ("hook", "b:q4", "ready"),
        ("stop", "b:q4"),
    ]
