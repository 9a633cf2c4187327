"""Pulls from a local HTTP server (127.0.0.1, allow-listed): progress, resume, verification."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from appliance.errors import Conflict
from appliance.store.errors import ChecksumMismatch
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import RangeServer, make_store, random_file, sha256_file

ALLOW = ["127.0.0.1"]


@pytest.fixture()
def server():
    with RangeServer() as srv:
        yield srv


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return make_store(tmp_path / "data", allow_private_pull_hosts=ALLOW)


@pytest.fixture()
def gguf(tmp_path: Path) -> Path:
    # Big enough for several chunks: a tiny model with a wider vocabulary.
    return make_tiny_gguf(tmp_path / "src.gguf", vocab=4096, n_embd=128)


def test_pull_installs_verified_file(store: ModelStore, server: RangeServer, gguf: Path) -> None:
    url = server.add("Tiny-Q8_0.gguf", gguf)
    info = store.pull(url, sha256=sha256_file(gguf))
    assert info.name == "tiny:q8_0" and info.status == "ready" and info.source == url
    assert sha256_file(store.settings.store_dir / info.path) == sha256_file(gguf)
    assert not [p for p in store.settings.store_dir.rglob("*") if ".partial" in p.name]


def test_pull_resumes_after_dropped_connections(store: ModelStore, server: RangeServer, gguf: Path) -> None:
    size = gguf.stat().st_size
    url = server.add("m.gguf", gguf, drop_after=size // 3, drops_left=2)
    info = store.pull(url, name="m:f32")
    assert info.sha256 == sha256_file(gguf)
    ranges = [r["range"] for r in server.requests]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:]) and len(ranges) == 3
    assert all(r["if_range"] == '"v1"' for r in server.requests[1:])


def test_pull_restarts_when_the_file_changed(store: ModelStore, server: RangeServer, gguf: Path) -> None:
    registry = JobRegistry()
    # A partial file left behind by a cancelled pull, then the server's file changes (new ETag):
    other = make_tiny_gguf(gguf.parent / "other.gguf", vocab=4096, n_embd=128, seed=7)
    url = server.add("o.gguf", other, delay_per_chunk=0.05, chunk=1 << 14)
    job = registry.submit("pull", "o:f32", lambda ctx: store.pull(url, name="o:f32", ctx=ctx).to_dict())
    while job.done_bytes < (1 << 15) and not job.finished:
        threading.Event().wait(0.02)
    registry.cancel(job.id)
    job.wait(30)
    assert job.state == "cancelled"
    assert store.get("o:f32").status == "downloading"
    server.files["o.gguf"].etag = '"v2"'
    server.files["o.gguf"].delay_per_chunk = 0
    info = store.pull(url, name="o:f32")
    assert info.sha256 == sha256_file(other)
    assert server.requests[-1]["if_range"] == '"v1"'  # asked to resume, server sent the whole new file


def test_pull_by_catalog_name_is_refused_for_folders(store: ModelStore) -> None:
    from appliance.errors import BadRequest

    with pytest.raises(BadRequest, match="not a single-file"):
        store.prepare_pull(name="llama-3.1-8b-instruct:awq-int4")


def test_sha256_mismatch_leaves_nothing(store: ModelStore, server: RangeServer, gguf: Path) -> None:
    url = server.add("m.gguf", gguf)
    with pytest.raises(ChecksumMismatch):
        store.pull(url, name="m:f32", sha256="0" * 64)
    assert store.list() == []
    assert not list(store.settings.store_dir.rglob("*.gguf*"))


def test_a_non_gguf_download_is_refused(store: ModelStore, server: RangeServer, tmp_path: Path) -> None:
    from appliance.modelfacts import InvalidModelFile

    junk = random_file(tmp_path / "junk.gguf", 100_000)
    url = server.add("junk.gguf", junk)
    with pytest.raises(InvalidModelFile):
        store.pull(url, name="junk:x")
    assert store.list() == [] and not list(store.settings.store_dir.rglob("*.gguf*"))


def test_concurrent_pulls_of_one_name_conflict(store: ModelStore, server: RangeServer, gguf: Path) -> None:
    url = server.add("m.gguf", gguf, delay_per_chunk=0.05, chunk=1 << 14)
    registry = JobRegistry()
    job = registry.submit("pull", "m:f32", lambda ctx: store.pull(url, name="m:f32", ctx=ctx).to_dict())
    while job.done_bytes == 0 and not job.finished:
        threading.Event().wait(0.02)
    with pytest.raises(Conflict):
        store.pull(url, name="m:f32")
    registry.cancel(job.id)
    job.wait(30)


@pytest.mark.slow
def test_pull_200_mb_with_progress_interruption_and_resume(tmp_path: Path, server: RangeServer) -> None:
    """The issue's bar: 200 MB from a local server, dropped halfway, resumed, verified, no .partial left."""
    store = make_store(tmp_path / "data", allow_private_pull_hosts=ALLOW)
    big = tmp_path / "big.gguf"
    # A real GGUF header first (so inspection passes), then 200 MB of random padding in a tensor-free tail.
    head = make_tiny_gguf(tmp_path / "head.gguf").read_bytes()
    random_file(big, 200 * 1024 * 1024, seed=5)
    with big.open("r+b") as f:
        f.write(head)
    size = big.stat().st_size
    url = server.add("big.gguf", big, drop_after=size // 2, drops_left=1, chunk=1 << 20)
    registry = JobRegistry()
    job = registry.submit("pull", "big:f32", lambda ctx: store.pull(url, name="big:f32", ctx=ctx).to_dict())
    job.wait(300)
    assert job.state == "done", job.message
    events = job.events_after(0)
    progress = [e["done_bytes"] for e in events if e["type"] == "progress"]
    assert len(progress) >= 3 and progress == sorted(progress) and progress[-1] == size
    assert any("resuming" in (e["message"] or "") for e in events)
    assert [r["range"] for r in server.requests] == [None, f"bytes={size // 2}-"]
    info = store.get("big:f32")
    assert info.status == "ready" and info.size_bytes == size and info.sha256 == sha256_file(big)
    assert store.verify("big:f32").status == "ready"
    assert not [p for p in store.settings.store_dir.rglob("*") if ".partial" in p.name]
