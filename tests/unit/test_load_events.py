"""Load events: the router publishes each load's phases, with its plan, its measured memory or its failure."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from appliance.errors import DoesNotFit, EngineUnavailable
from appliance.serving.load_events import LoadEvent, LoadEvents, LoadPlanSummary
from appliance.serving.router import Router
from tests.unit.test_router import Plan, StandInEngine, resolve

SETTINGS = SimpleNamespace(max_loaded_instances=2, memory_budget_gib=None, queue_size=4, queue_timeout_seconds=1)


class MeasuredEngine(StandInEngine):
    def rss_bytes(self):
        return 123_456_789


class FailingEngine(StandInEngine):
    async def start(self):
        self.state = "loading"
        raise EngineUnavailable("Engine for a:q4 exited during load (code 1): llama_model_load: error loading model")


def _router(events: LoadEvents, engine=MeasuredEngine, make_plan=lambda target: Plan(), gpu_bytes=None) -> Router:
    return Router(
        SETTINGS, make_plan=make_plan, make_engine_process=lambda n, p: engine(n, []), events=events, gpu_bytes=gpu_bytes
    )


async def test_a_load_publishes_planning_starting_then_loaded_with_plan_and_measured_memory():
    events = LoadEvents()
    follower = events.follow()
    await _router(events, gpu_bytes=lambda engine, plan: 1000).load(resolve("a"))
    seen = [follower.queue.get_nowait() for _ in range(follower.queue.qsize())]
    follower.close()
    assert [e.phase for e in seen] == ["planning", "starting", "loaded"]
    loaded = seen[-1]
    assert loaded.plan == LoadPlanSummary(
        backend="llamacpp",
        variant="q4",
        context=512,
        parallel=2,
        devices=("cpu",),
        n_gpu_layers=0,
        estimated_bytes=100,
        reason="stand-in plan",
    )
    assert loaded.rss_bytes == 123_456_789 and loaded.gpu_bytes == 1000 and loaded.measured_bytes == 123_457_789
    assert loaded.finished and events.latest("a:q4") is loaded and events.in_progress() == []


async def test_an_engine_that_fails_to_start_leaves_its_reason_as_the_latest_event():
    events = LoadEvents()
    router = _router(events, engine=FailingEngine)
    with pytest.raises(EngineUnavailable):
        await router.load(resolve("a"))
    latest = events.latest("a:q4")
    assert latest is not None and latest.phase == "failed"
    assert "error loading model" in (latest.error or "") and latest.plan is not None
    assert "a:q4" not in router.instances


async def test_a_refused_plan_fails_without_a_plan():
    def refuse(target):
        raise DoesNotFit("a:q4 needs 9.1 GiB > 7.8 GiB free")

    events = LoadEvents()
    with pytest.raises(DoesNotFit):
        await _router(events, make_plan=refuse).load(resolve("a"))
    latest = events.latest("a:q4")
    assert latest is not None and latest.phase == "failed" and latest.plan is None and "9.1 GiB" in (latest.error or "")


async def test_unloading_forgets_the_load_and_followers_read_in_order():
    events = LoadEvents()
    router = _router(events)
    follower = events.follow()

    async def read(n):
        out = []
        async for event in follower:
            out.append(event.phase)
            if len(out) == n:
                return out

    reader = asyncio.ensure_future(read(3))
    await router.load(resolve("a"))
    assert await asyncio.wait_for(reader, 2) == ["planning", "starting", "loaded"]
    follower.close()
    await router.unload("a:q4")
    assert events.latest("a:q4") is None


def test_a_slow_follower_loses_its_oldest_events_and_never_blocks_a_publisher():
    events = LoadEvents()
    follower = events.follow()
    for i in range(300):
        events.publish(LoadEvent(f"m:{i}", "planning", 0.0))
    assert follower.queue.qsize() == 256
    assert follower.queue.get_nowait().model == "m:44"


def test_placement_in_words():
    def summary(devices, layers):
        return LoadPlanSummary("llamacpp", "q4", 512, 1, devices, layers, 1, "").placement

    assert summary(("cpu",), 0) == "CPU only"
    assert summary(("cuda:0",), -1) == "all layers on cuda:0"
    assert summary(("cuda:0", "cpu"), 12) == "12 layers on cuda:0, the rest on the CPU"
