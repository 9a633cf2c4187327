"""A read-only store (``store_read_only = true``): the models an admin keeps there are registered and served,
and nothing in its folder is ever created, changed or deleted."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from appliance.store import split_gguf
from appliance.store.errors import StoreReadOnly
from tests.daemon import RunningDaemon, daemon_env, free_port
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_hf_folder, make_store


def _snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(folder))] = (
            st.st_mode,
            st.st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "",
        )
    return out


def _fill(models: Path, tmp_path: Path) -> None:
    models.mkdir(parents=True)
    make_tiny_gguf(models / "Tiny-Q8_0.gguf", seed=1)
    make_tiny_gguf(models / "fam" / "Fam-F32.gguf", seed=2)
    first = make_tiny_gguf(tmp_path / "split-src" / "s.gguf", seed=3, split_max_tensors=8)
    (models / "split" / "q4_0").mkdir(parents=True)
    for part in split_gguf.parts_of(first):
        shutil.copy(part, models / "split" / "q4_0" / part.name)
    make_hf_folder(models / "Tiny-HF")
    make_hf_folder(models / "evil-hf", files={"modeling_evil.py": b"import os"})  # refused by the import policy
    (models / "notes.txt").write_text("not a model")


def test_models_in_a_read_only_store_are_registered_and_never_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    models = data / "models"
    _fill(models, tmp_path)
    before = _snapshot(models)
    store = make_store(data, store_read_only=True)
    found = store.register_found()
    assert sorted(i.name for i in found) == ["fam:f32", "split:q4_0", "tiny-hf:bf16", "tiny:q8_0"]
    assert store.resolve("split:q4_0").file.name.endswith("-00001-of-00003.gguf")
    assert store.get("split:q4_0").size_bytes == split_gguf.size_of(store.resolve("split:q4_0").file)
    assert all(store.verify(i.name).status == "ready" for i in found)
    assert store.register_found() == []  # nothing new: nothing hashed again
    refusals = [
        lambda: store.prepare_pull("https://example.com/m.gguf", name="m:f32"),
        lambda: store.prepare_hub_pull("hf:org/repo"),
        lambda: store.prepare_import(str(models / "Tiny-Q8_0.gguf"), "x:y"),
        lambda: store.prepare_quantize("fam:f32", "q8_0"),
        lambda: store.delete("tiny:q8_0"),
    ]
    for call in refusals:
        with pytest.raises(StoreReadOnly, match="store_read_only = true"):
            call()
    assert _snapshot(models) == before  # registering, verifying and refusing wrote nothing there
    (models / "Tiny-Q8_0.gguf").unlink()  # the admin removes a file ...
    make_tiny_gguf(models / "Other-Q8_0.gguf", seed=4)  # ... and adds one
    assert [i.name for i in store.register_found()] == ["other:q8_0"]
    assert sorted(i.name for i in store.list()) == ["fam:f32", "other:q8_0", "split:q4_0", "tiny-hf:bf16"]


def test_a_daemon_serves_from_a_read_only_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    models = data / "models"
    models.mkdir(parents=True)
    make_tiny_gguf(models / "Tiny-Q8_0.gguf", vocab=1024)
    before = _snapshot(models)
    port = free_port()
    daemon = RunningDaemon(
        data, port, daemon_env(data, port, APPLIANCE_STORE_READ_ONLY="true", APPLIANCE_DEFAULT_MODEL="tiny:q8_0")
    ).start()
    try:
        key = daemon.create_key("ro")
        with daemon.client(key) as client:
            r = client.post("/v1/completions", json={"model": "tiny:q8_0", "prompt": "hello", "max_tokens": 4})
            assert r.status_code == 200, r.text
        with daemon.admin() as admin:
            r = admin.delete("/admin/models/tiny:q8_0")
            assert r.status_code == 403 and r.json()["error"]["code"] == "store_read_only"
            r = admin.post("/admin/models/pull", json={"url": "hf:org/repo"})
            assert r.status_code == 403 and "store_read_only = true" in r.json()["error"]["message"]
    finally:
        daemon.stop()
    assert _snapshot(models) == before
