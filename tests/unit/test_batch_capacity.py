"""When batch lines may start: counted against a real admission queue that interactive requests hold slots of."""

from __future__ import annotations

import asyncio

import pytest

from appliance.batch.capacity import Capacity
from appliance.serving.admission import AdmissionQueue
from appliance.serving.router import Instance, Router
from appliance.settings import Settings


def _never(*_: object) -> object:
    raise AssertionError("nothing is loaded in these tests")


def _capacity(tmp_path, slots: int = 4, **settings: object) -> tuple[Capacity, AdmissionQueue]:
    config = Settings(data_dir=tmp_path, **settings)
    router = Router(config, make_plan=_never, make_engine_process=_never)  # type: ignore[arg-type]
    queue = AdmissionQueue(slots, max_waiting=16, timeout_s=30)
    router.instances["m:q4"] = Instance("m:q4", plan=None, engine=None, queue=queue)  # type: ignore[arg-type]
    return Capacity(config, router, names=None), queue  # type: ignore[arg-type]


def _fill(capacity: Capacity, model: str, queue: AdmissionQueue | None = None) -> int:
    """Start batch lines on ``model`` while allowed (each takes a slot of ``queue``, as the gateway's lease would)."""
    started = 0
    while capacity.may_start(model):
        capacity.acquire(model)
        if queue is not None:
            queue.active += 1
        started += 1
        assert started < 100
    return started


def test_a_quiet_model_takes_all_but_the_reserved_slot(tmp_path):
    capacity, queue = _capacity(tmp_path, batch_reserved_slots=1, batch_max_in_flight=16)
    assert _fill(capacity, "m:q4", queue) == 3


@pytest.mark.parametrize(("interactive", "allowed"), [(0, 3), (1, 2), (2, 1), (3, 0), (4, 0)])
def test_interactive_requests_leave_batch_what_remains(tmp_path, interactive, allowed):
    capacity, queue = _capacity(tmp_path, batch_reserved_slots=1, batch_max_in_flight=16)

    async def hold() -> None:
        for _ in range(interactive):
            await queue.acquire("interactive")

    asyncio.run(hold())
    assert _fill(capacity, "m:q4", queue) == allowed


def test_nothing_starts_while_a_request_waits_and_one_line_always_runs_on_a_quiet_box(tmp_path):
    capacity, queue = _capacity(tmp_path, slots=1, batch_reserved_slots=1, batch_max_in_flight=16)
    assert _fill(capacity, "m:q4", queue) == 1  # one slot, reserved for interactive, but nothing else runs: work-conserving

    async def wait_behind() -> None:
        waiter = asyncio.ensure_future(queue.acquire("interactive"))
        await asyncio.sleep(0)
        assert queue.waiting == 1
        capacity.release("m:q4")
        assert not capacity.may_start("m:q4")  # an interactive request waits: batch starts nothing
        queue.release()  # the batch line's slot goes to the waiting interactive request
        await waiter

    asyncio.run(wait_behind())
    assert queue.active == 1 and not capacity.may_start("m:q4")


def test_a_model_not_loaded_gets_one_line_and_all_batches_share_the_cap(tmp_path):
    capacity, queue = _capacity(tmp_path, batch_reserved_slots=0, batch_max_in_flight=5)
    assert _fill(capacity, "other:f16") == 1  # its first line loads it
    assert _fill(capacity, "m:q4", queue) == 4
    assert capacity.total == 5 and not capacity.may_start("third:q8")
