"""Load on demand, LRU eviction, idle unload and queueing, against the real daemon and real engines."""

import asyncio
import time

import httpx
import pytest

from tests.daemon import start_daemon

pytestmark = pytest.mark.slow


def _instances(daemon) -> dict[str, dict]:
    with daemon.admin() as admin:
        return {i["model"]: i for i in admin.get("/admin/instances/").json()}


def _chat(client: httpx.Client, model: str, max_tokens: int = 4) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "temperature": 0},
    )


@pytest.fixture(scope="module")
def small_box(tmp_path_factory, tiny_gguf):
    """A daemon allowed one loaded instance, unloading after 3 idle seconds."""
    daemon = start_daemon(
        tmp_path_factory.mktemp("router"),
        APPLIANCE_MAX_LOADED_INSTANCES="1",
        APPLIANCE_IDLE_UNLOAD_SECONDS="3",
        APPLIANCE_ENGINE_PARALLEL="1",
        APPLIANCE_QUEUE_SIZE="1",
        APPLIANCE_QUEUE_TIMEOUT_SECONDS="20",
    )
    with daemon.admin() as admin:
        response = admin.post("/admin/models/import", json={"path": str(tiny_gguf), "name": "tiny:f32"})
        assert response.status_code in (200, 201, 202), response.text
        job = response.json()
        if "job" in job or "id" in job and job.get("kind"):
            job_id = job.get("job", job).get("id")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and admin.get(f"/admin/jobs/{job_id}").json()["state"] == "running":
                time.sleep(0.2)
    yield daemon
    daemon.stop()


def test_load_on_demand_then_lru_eviction(small_box):
    key = small_box.create_key("router")
    assert _instances(small_box) == {}
    with small_box.client(key) as client:
        assert _chat(client, "default").status_code == 200
        assert set(_instances(small_box)) == {"gemma-3-270m:q4_k_m"}
        assert _chat(client, "tiny:f32").status_code == 200
        assert set(_instances(small_box)) == {"tiny:f32"}  # the default model was evicted to make room


def test_idle_unload(small_box):
    key = small_box.create_key("idle")
    with small_box.client(key) as client:
        assert _chat(client, "tiny:f32").status_code == 200
    assert "tiny:f32" in _instances(small_box)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _instances(small_box):
        time.sleep(0.5)
    assert _instances(small_box) == {}


def test_pinned_instance_survives_idle_and_blocks_eviction(small_box):
    key = small_box.create_key("pin")
    with small_box.admin() as admin:
        assert admin.post("/admin/instances/tiny:f32/load", params={"pin": True}).status_code == 200
    time.sleep(8)
    assert _instances(small_box)["tiny:f32"]["pinned"] is True
    with small_box.client(key) as client:
        response = _chat(client, "default")
    assert response.status_code == 503 and response.headers.get("retry-after")
    with small_box.admin() as admin:
        admin.post("/admin/instances/tiny:f32/pin", params={"pinned": False}).raise_for_status()
        admin.post("/admin/instances/tiny:f32/unload").raise_for_status()


def test_queue_full_is_429_and_the_rest_complete(small_box):
    key = small_box.create_key("queue")

    async def scenario():
        async with httpx.AsyncClient(base_url=small_box.url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            body = {"model": "default", "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
            await client.post("/v1/completions", json={**body, "max_tokens": 1})  # load first
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(4)))

    statuses = sorted(r.status_code for r in asyncio.run(scenario()))
    # one slot + one queue place: two complete, the others are told to come back
    assert statuses.count(200) == 2, statuses
    assert statuses.count(429) == 2, statuses
