import asyncio

import pytest

from appliance.errors import EngineUnavailable, RateLimited
from appliance.serving.admission import AdmissionQueue


async def test_slots_then_queue_then_429():
    queue = AdmissionQueue(slots=2, max_waiting=2, timeout_s=5)
    await queue.acquire()
    await queue.acquire()
    waiters = [asyncio.create_task(queue.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert queue.waiting == 2
    with pytest.raises(RateLimited) as info:
        await queue.acquire()
    assert info.value.status == 429 and info.value.headers["Retry-After"]
    queue.release()
    await asyncio.sleep(0.01)
    assert sum(w.done() for w in waiters) == 1
    queue.release()
    await asyncio.gather(*waiters)
    assert queue.active == 2 and queue.waiting == 0


async def test_interactive_served_before_batch():
    queue = AdmissionQueue(slots=1, max_waiting=10, timeout_s=5)
    await queue.acquire()
    order: list[str] = []

    async def wait(priority: str, tag: str):
        await queue.acquire(priority)
        order.append(tag)

    tasks = [asyncio.create_task(wait("batch", "b1")), asyncio.create_task(wait("batch", "b2"))]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(wait("interactive", "i1")))
    await asyncio.sleep(0)
    for _ in range(3):
        queue.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["i1", "b1", "b2"]


async def test_queue_timeout_is_503_with_retry_after_and_frees_place():
    queue = AdmissionQueue(slots=1, max_waiting=1, timeout_s=0.05)
    await queue.acquire()
    with pytest.raises(EngineUnavailable) as info:
        await queue.acquire()
    assert info.value.status == 503 and "Retry-After" in info.value.headers
    assert queue.waiting == 0
    queue.release()
    assert queue.active == 0


async def test_cancelled_waiter_leaves_the_queue():
    queue = AdmissionQueue(slots=1, max_waiting=4, timeout_s=5)
    await queue.acquire()
    waiter = asyncio.create_task(queue.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert queue.waiting == 0
    queue.release()
    assert queue.active == 0
