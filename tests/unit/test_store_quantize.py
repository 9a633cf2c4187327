"""Quantization through the store: a child process, progress, cancel, parent recorded, loads in llama.cpp."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from appliance.errors import BadRequest, Conflict
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_hf_folder, make_store


@pytest.fixture()
def store(tmp_path: Path, tiny_gguf: Path) -> ModelStore:
    store = make_store(tmp_path / "data", engine_threads=1)
    store.import_path(str(tiny_gguf), name="tiny:f32")
    return store


def test_quantize_registers_a_loadable_child_variant(store: ModelStore) -> None:
    import llama_cpp

    registry = JobRegistry()
    job = registry.submit("quantize", "tiny:q4_k_m", lambda ctx: store.quantize("tiny:f32", "q4_k_m", ctx=ctx).to_dict())
    job.wait(120)
    assert job.state == "done", job.message
    info = store.get("tiny:q4_k_m")
    assert (info.parent, info.status, info.source) == ("tiny:f32", "ready", "quantize:tiny:f32")
    assert info.size_bytes < store.get("tiny:f32").size_bytes / 3
    assert info.facts["architecture"] == "llama" and info.quantization == "Q4_K_M"
    progress = [e for e in job.events_after(0) if e["type"] == "progress" and e["message"] == "quantizing to q4_k_m"]
    assert progress and progress[-1]["total_bytes"] == store.get("tiny:f32").size_bytes
    path = store.resolve("tiny:q4_k_m").file
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
    llm.eval(llm.tokenize(b"hello world"))
    assert llm.n_tokens > 0
    assert store.verify("tiny:q4_k_m").status == "ready"


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("tiny:f32", "q9_x", "unknown target"),
        ("tiny:f32", "F32", "unknown target"),
    ],
)
def test_bad_targets(store: ModelStore, source: str, target: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        store.prepare_quantize(source, target)


def test_only_high_precision_gguf_sources(store: ModelStore, tmp_path: Path) -> None:
    store.quantize("tiny:f32", "q4_k_m")
    with pytest.raises(BadRequest, match="quantize from an F32, F16, BF16"):
        store.prepare_quantize("tiny:q4_k_m", "q2_k")
    store.quantize("tiny:f32", "q8_0")
    with pytest.raises(BadRequest, match="not smaller"):
        store.prepare_quantize("tiny:q8_0", "q8_0")
    store.quantize("tiny:q8_0", "q4_0")  # Q8_0 may be re-quantized
    assert store.get("tiny:q4_0").parent == "tiny:q8_0"
    store.import_path(str(make_hf_folder(tmp_path / "hf")), name="hf:bf16")
    with pytest.raises(BadRequest, match="only GGUF"):
        store.prepare_quantize("hf:bf16", "q4_k_m")
    with pytest.raises(Conflict, match="already installed"):
        store.prepare_quantize("tiny:f32", "q4_k_m")


def test_cancel_kills_the_quantizer_and_leaves_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path / "data", engine_threads=1)
    big = make_tiny_gguf(tmp_path / "big.gguf", n_layer=8, n_embd=512, n_head=8, n_kv_head=4, vocab=8192)
    store.import_path(str(big), name="big:f32")
    registry = JobRegistry()
    job = registry.submit("quantize", "big:q2_k", lambda ctx: store.quantize("big:f32", "q2_k", ctx=ctx).to_dict())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (job._process is None or job.done_bytes == 0) and not job.finished:
        time.sleep(0.01)
    proc = job._process
    assert proc is not None and not job.finished, "the quantizer finished before it could be cancelled"
    registry.cancel(job.id)
    job.wait(30)
    assert job.state == "cancelled"
    assert proc.poll() is not None  # the child is gone
    assert [i.name for i in store.list()] == ["big:f32"]
    assert not (store.settings.store_dir / "big" / "q2_k").exists()
