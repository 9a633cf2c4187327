"""The /admin/models and /admin/jobs API, in-process (no auth layer: the app adds the admin guard)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.storekit import RangeServer, make_app, make_store, sha256_file


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return make_store(tmp_path / "data", allow_private_pull_hosts=["127.0.0.1"])


@pytest.fixture()
def client(store: ModelStore) -> Iterator[TestClient]:
    jobs = JobRegistry(store.db)
    with TestClient(make_app(store, jobs)) as c:
        yield c
    jobs.shutdown()


def wait_job(client: TestClient, job_id: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/admin/jobs/{job_id}").json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def test_import_inspect_list_verify_delete(client: TestClient, tiny_gguf: Path) -> None:
    r = client.post("/admin/models/import", json={"path": str(tiny_gguf), "name": "tiny:f32"})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    assert job["state"] == "done" and job["result"]["name"] == "tiny:f32"

    listed = client.get("/admin/models").json()
    assert [m["name"] for m in listed] == ["tiny:f32"] and listed[0]["status"] == "ready"
    assert "chat_template" not in listed[0]["facts"] and listed[0]["facts"]["has_chat_template"] is False

    detail = client.get("/admin/models/tiny:f32").json()
    assert detail["facts"]["architecture"] == "llama" and detail["catalog"] is None
    assert client.get("/admin/models/tiny").json()["name"] == "tiny:f32"

    r = client.post("/admin/models/tiny:f32/verify")
    assert r.status_code == 202
    assert wait_job(client, r.json()["id"])["result"]["status"] == "ready"

    r = client.delete("/admin/models/tiny:f32")
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert client.get("/admin/models").json() == []
    assert client.get("/admin/models/tiny:f32").status_code == 404


def test_pull_job_streams_progress_as_sse(client: TestClient, tmp_path: Path) -> None:
    from tests.ggufkit import make_tiny_gguf

    src = make_tiny_gguf(tmp_path / "src.gguf", vocab=4096, n_embd=128)
    with RangeServer() as server:
        url = server.add("pulled-Q8_0.gguf", src, delay_per_chunk=0.01, chunk=1 << 16)
        r = client.post("/admin/models/pull", json={"url": url, "sha256": sha256_file(src)})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["kind"] == "pull" and job["target"] == "pulled:q8_0"
        events = client.get(f"/admin/jobs/{job['id']}/events")
    assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
    parsed = sse_events(events.text)
    assert parsed[-1]["type"] == "state" and parsed[-1]["state"] == "done"
    assert any(e["type"] == "progress" and e["total_bytes"] == src.stat().st_size for e in parsed)
    assert [e["seq"] for e in parsed] == sorted(e["seq"] for e in parsed)
    # Reconnecting with Last-Event-ID replays only what came after.
    later = client.get(f"/admin/jobs/{job['id']}/events", headers={"Last-Event-ID": str(parsed[-2]["seq"])})
    assert [e["seq"] for e in sse_events(later.text)] == [parsed[-1]["seq"]]


def test_errors_use_the_one_envelope(client: TestClient) -> None:
    r = client.post("/admin/models/pull", json={"url": "ftp://example.com/x.gguf"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "pull_not_allowed"
    r = client.post("/admin/models/import", json={"path": "relative/path.gguf"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path"
    r = client.get("/admin/jobs/999")
    assert r.status_code == 404
    r = client.post("/admin/models/pull", json={"url": "http://127.0.0.1/x.gguf", "unknown": 1})
    assert r.status_code == 400


def test_quantize_job_and_cancel(client: TestClient, tmp_path: Path) -> None:
    from tests.ggufkit import make_tiny_gguf

    src = make_tiny_gguf(tmp_path / "src.gguf")
    wait_job(client, client.post("/admin/models/import", json={"path": str(src), "name": "tiny:f32"}).json()["id"])
    r = client.post("/admin/models/tiny:f32/quantize", json={"to": "q8_0"})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    assert job["state"] == "done", job
    assert job["result"]["name"] == "tiny:q8_0" and job["result"]["parent"] == "tiny:f32"
    r = client.post("/admin/models/tiny:q8_0/quantize", json={"to": "q8_0"})
    assert r.status_code == 400
    r = client.post("/admin/models/tiny:f32/quantize", json={"to": "q9_z"})
    assert r.status_code == 400
    # Cancelling a finished job is harmless and answers the job.
    assert client.post(f"/admin/jobs/{job['id']}/cancel").json()["state"] == "done"


def test_jobs_are_recorded_in_the_database(client: TestClient, store: ModelStore, tiny_gguf: Path) -> None:
    from sqlmodel import select

    from appliance.db import engine as dbmod
    from appliance.db.tables import Job

    job = wait_job(client, client.post("/admin/models/import", json={"path": str(tiny_gguf)}).json()["id"])
    with dbmod.session(store.db) as s:
        row = s.exec(select(Job).where(Job.id == job["id"])).one()
    assert (row.kind, row.state, row.finished_at is not None) == ("import", "done", True)
    assert [j["id"] for j in client.get("/admin/jobs").json()] == [job["id"]]


def test_set_default(client: TestClient, tiny_gguf: Path, tmp_path: Path) -> None:
    from tests.ggufkit import make_tiny_gguf

    other = make_tiny_gguf(tmp_path / "o.gguf", seed=2)
    for path, name in ((tiny_gguf, "tiny:a"), (other, "tiny:b")):
        wait_job(client, client.post("/admin/models/import", json={"path": str(path), "name": name}).json()["id"])
    assert client.post("/admin/models/tiny:b/default").json()["is_default"] is True
    assert client.get("/admin/models/tiny").json()["name"] == "tiny:b"
