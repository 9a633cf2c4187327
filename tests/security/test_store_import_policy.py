"""reliability-table rows 5 (import side), 6 and 7: what the store lets in.

Row 5: a GGUF whose chat template is an SSTI payload imports fine, is flagged,
and is never rendered here (no marker file, the template is not in list views).
Row 6: hostile GGUF headers are refused fast, without large allocations, and
leave nothing behind. Row 7: code, pickles and ``auto_map`` in an HF folder are
refused; only GGUF and safetensors come in.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.errors import BadRequest
from appliance.store.errors import ModelNotDownloaded
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_app, make_hf_folder, make_store


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return make_store(tmp_path / "data")


def assert_empty(store: ModelStore) -> None:
    assert store.list() == []
    leftovers = [p for p in store.settings.store_dir.rglob("*") if p.is_file()]
    assert leftovers == []


# ---------------------------------------------------------------- row 5
def test_hostile_chat_template_imports_flagged_and_unrendered(store: ModelStore, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    template = (
        "{{ lipsum.__globals__['os'].popen('touch "
        + str(marker)
        + "').read() }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    path = make_tiny_gguf(tmp_path / "evil.gguf", chat_template=template)
    info = store.import_path(str(path), name="evil:f32")
    assert info.status == "ready"
    assert {"__globals__", "popen"} <= set(info.facts["chat_template_flags"])
    jobs = JobRegistry()
    with TestClient(make_app(store, jobs)) as client:
        listed = client.get("/admin/models").json()[0]
        assert "chat_template" not in listed["facts"] and listed["facts"]["has_chat_template"] is True
        detail = client.get("/admin/models/evil:f32").json()
        assert detail["facts"]["chat_template"] == template  # shown as data, never rendered
    store.resolve("evil:f32")
    store.verify("evil:f32")
    assert not marker.exists()


# ---------------------------------------------------------------- row 6
def _kv_string(key: str, value: bytes, declared_len: int | None = None) -> bytes:
    k = key.encode()
    return (
        struct.pack("<Q", len(k))
        + k
        + struct.pack("<I", 8)
        + struct.pack("<Q", declared_len if declared_len is not None else len(value))
        + value
    )


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 4) + struct.pack("<I", value)


def _gguf(n_tensors: int, kvs: list[bytes]) -> bytes:
    return b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", n_tensors) + struct.pack("<Q", len(kvs)) + b"".join(kvs)


HOSTILE = {
    "huge_string_length": _gguf(0, [_kv_string("general.architecture", b"llama", declared_len=1 << 62)]),
    "huge_kv_count": b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + struct.pack("<Q", 1 << 60),
    "huge_tensor_count": _gguf(1 << 61, [_kv_string("general.architecture", b"llama")]),
    "absurd_block_count": _gguf(
        0,
        [
            _kv_string("general.architecture", b"llama"),
            _kv_u32("llama.block_count", 100_000),
            _kv_u32("llama.embedding_length", 64),
            _kv_u32("llama.attention.head_count", 4),
        ],
    ),
    "huge_array": _gguf(
        0,
        [
            struct.pack("<Q", 21)
            + b"tokenizer.ggml.tokens"
            + struct.pack("<I", 9)
            + struct.pack("<I", 8)
            + struct.pack("<Q", 1 << 60)
        ],
    ),
    "truncated": b"GGUF" + struct.pack("<I", 3) + b"\x01",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_gguf_is_refused_fast_and_leaves_nothing(store: ModelStore, tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.gguf"
    path.write_bytes(HOSTILE[kind] + b"\x00" * 256)
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(BadRequest) as info:
        store.import_path(str(path), name="evil:x")
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert info.value.code == "invalid_model_file"
    assert elapsed < 1.0 and peak < 32 << 20
    assert str(tmp_path) not in info.value.message  # no absolute paths in errors
    assert_empty(store)


def test_non_gguf_files_are_refused(store: ModelStore, tmp_path: Path) -> None:
    pickle = tmp_path / "model.gguf"
    pickle.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle named .gguf
    with pytest.raises(BadRequest, match="only GGUF"):
        store.import_path(str(pickle))
    assert_empty(store)


# ---------------------------------------------------------------- row 7
REFUSED_FILES = {
    "modeling_evil.py": b"import os; os.system('id')",
    "pytorch_model.bin": b"\x80\x04pickle",
    "model.pt": b"\x80\x04pickle",
    "weights.pth": b"\x80\x04pickle",
    "optimizer.pkl": b"\x80\x04pickle",
    "model.ckpt": b"\x80\x04pickle",
    "original/consolidated.00.pth": b"\x80\x04pickle",
    "run.sh": b"#!/bin/sh",
    "blob.dat": b"?",
}


@pytest.mark.parametrize("filename", sorted(REFUSED_FILES))
def test_hf_folders_with_code_or_pickles_are_refused(store: ModelStore, tmp_path: Path, filename: str) -> None:
    folder = make_hf_folder(tmp_path / "hf", files={filename: REFUSED_FILES[filename]})
    with pytest.raises(BadRequest) as info:
        store.import_path(str(folder), name="evil:bf16")
    assert info.value.code == "import_refused"
    assert_empty(store)


@pytest.mark.parametrize("config_file", ["config.json", "tokenizer_config.json"])
def test_auto_map_is_refused(store: ModelStore, tmp_path: Path, config_file: str) -> None:
    import json

    folder = make_hf_folder(tmp_path / "hf")
    cfg = json.loads((folder / config_file).read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / config_file).write_text(json.dumps(cfg))
    with pytest.raises(BadRequest, match="auto_map"):
        store.import_path(str(folder), name="evil:bf16")
    assert_empty(store)


def test_refusals_answer_400_through_the_api(store: ModelStore, tmp_path: Path) -> None:
    folder = make_hf_folder(tmp_path / "hf", files={"pytorch_model.bin": b"\x80\x04"})
    jobs = JobRegistry()
    with TestClient(make_app(store, jobs)) as client:
        r = client.post("/admin/models/import", json={"path": str(folder)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "import_refused"
    assert_empty(store)


def test_a_clean_hf_folder_imports_without_hidden_entries(store: ModelStore, tmp_path: Path) -> None:
    folder = make_hf_folder(tmp_path / "Tiny-Llama-HF")
    (folder / ".git").mkdir()
    (folder / ".git" / "evil.py").write_text("boom")
    info = store.import_path(str(folder))
    assert (info.name, info.format, info.quantization, info.status) == ("tiny-llama-hf:bf16", "safetensors", "bf16", "ready")
    stored = store.settings.store_dir / info.path
    assert sorted(p.name for p in stored.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert store.resolve("tiny-llama-hf").file == stored


# ---------------------------------------------------------------- the same policy for hub pulls
@pytest.fixture()
def hub_world(tmp_path: Path):
    from tests.hubkit import HubServer
    from tests.storekit import RangeServer

    with RangeServer() as cdn, HubServer(cdn) as hub:
        store = make_store(tmp_path / "hubdata", allow_private_pull_hosts=["127.0.0.1"], hub_url=hub.url)
        yield store, hub, cdn


@pytest.mark.parametrize(
    "spec", ["hf:org/repo/modeling.py", "hf:org/repo/pytorch_model.bin", "hf:org/repo/model.pt", "hf:org/repo/model.safetensors"]
)
def test_a_hub_file_that_is_not_gguf_is_refused(hub_world, spec: str) -> None:
    store, hub, _cdn = hub_world
    with pytest.raises(BadRequest, match="only a .gguf file"):
        store.prepare_hub_pull(spec)
    assert hub.requests == []


def test_a_hub_repository_with_only_pickles_is_refused(hub_world, tmp_path: Path) -> None:
    store, hub, cdn = hub_world
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    (tmp_path / "modeling_evil.py").write_text("import os")
    hub.add_repo("org/Pickles", {name: tmp_path / name for name in ("config.json", "pytorch_model.bin", "modeling_evil.py")})
    with pytest.raises(BadRequest, match="neither GGUF files nor safetensors"):
        store.prepare_hub_pull("hf:org/Pickles")
    assert cdn.requests == []
    assert_empty(store)


def test_a_hub_repository_that_needs_remote_code_is_refused(hub_world, tmp_path: Path) -> None:
    store, hub, _cdn = hub_world
    folder = make_hf_folder(tmp_path / "remote", config={"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}})
    hub.add_repo("org/Remote", {p.name: p for p in folder.iterdir()})
    pull = store.prepare_hub_pull("hf:org/Remote")
    with pytest.raises(BadRequest, match="auto_map"):
        store.pull_hub(pull)
    assert_empty(store)


def test_a_hub_file_whose_bytes_do_not_match_the_listed_sha256_is_refused(hub_world, tmp_path: Path) -> None:
    store, hub, _cdn = hub_world
    model = make_tiny_gguf(tmp_path / "m.gguf")
    hub.add_repo("org/Bad-GGUF", {"Bad-Q8_0.gguf": model}, listed_sha256={"Bad-Q8_0.gguf": "ab" * 32})
    with pytest.raises(BadRequest, match="sha256 mismatch"):
        store.pull_hub(store.prepare_hub_pull("hf:org/Bad-GGUF"))
    # nothing is installed: the variant stays listed as available on the hub (no files), as after any failed pull
    assert [(v.name, v.status, v.path) for v in store.list()] == [("bad:q8_0", "available", "")]
    assert [p for p in store.settings.store_dir.rglob("*") if p.is_file()] == []
    with pytest.raises(ModelNotDownloaded):
        store.resolve("bad:q8_0")
