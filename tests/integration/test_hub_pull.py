"""Pulls of ``hf:ORG/REPO`` from a local hub (tests/hubkit.py) whose downloads redirect to a local CDN."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from appliance.db import engine as dbmod
from appliance.errors import BadRequest
from appliance.planner.service import hub_chooser
from appliance.store import split_gguf
from appliance.store.errors import HubAccessDenied
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer, make_hf_folder, make_settings, make_store, sha256_file

ALLOW = ["127.0.0.1"]
TOKEN = "hf_canary_6f1d2c9a8b7e4f30"


@pytest.fixture()
def cdn():
    with RangeServer() as srv:
        yield srv


@pytest.fixture()
def hub(cdn: RangeServer):
    with HubServer(cdn, token=TOKEN) as srv:
        yield srv


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hub-models")
    split_first = make_tiny_gguf(base / "split" / "Tiny-Q4_0.gguf", vocab=4096, n_embd=128, seed=3, split_max_tensors=8)
    return {
        "Tiny-Q8_0.gguf": make_tiny_gguf(base / "q8.gguf", seed=1),
        "Tiny-F32.gguf": make_tiny_gguf(base / "f32.gguf", vocab=1024, seed=2),
        **{p.name: p for p in split_gguf.parts_of(split_first)},
    }


def _store(tmp_path: Path, hub: HubServer, **overrides: object) -> ModelStore:
    return make_store(tmp_path / "data", allow_private_pull_hosts=ALLOW, hub_url=hub.url, **overrides)


def _no_partials(store: ModelStore) -> bool:
    return not [p for p in store.settings.store_dir.rglob("*") if ".partial" in p.name]


def test_pull_by_name_and_quantization(tmp_path: Path, hub: HubServer, cdn: RangeServer, ggufs: dict[str, Path]) -> None:
    hub.add_repo(
        "org/Tiny-GGUF",
        {"Tiny-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"], "Tiny-F32.gguf": ggufs["Tiny-F32.gguf"], "README.md": ggufs["Tiny-F32.gguf"]},
    )
    store = _store(tmp_path, hub)
    pull = store.prepare_hub_pull("hf:org/Tiny-GGUF:q8_0")  # any case
    assert pull.name == "tiny:q8_0" and {v["variant"] for v in pull.to_dict()["variants"]} == {"q8_0", "f32"}
    listed = {v["variant"]: v["files"][0] for v in pull.to_dict()["variants"]}  # every variant with its real size and sha256
    assert listed["f32"] == {
        "path": "Tiny-F32.gguf",
        "size_bytes": ggufs["Tiny-F32.gguf"].stat().st_size,
        "sha256": sha256_file(ggufs["Tiny-F32.gguf"]),
    }
    info = store.pull_hub(pull)
    assert info.status == "ready" and info.source == "hf:org/Tiny-GGUF/Tiny-Q8_0.gguf"
    assert info.sha256 == sha256_file(ggufs["Tiny-Q8_0.gguf"]) and info.size_bytes == ggufs["Tiny-Q8_0.gguf"].stat().st_size
    assert store.resolve("tiny:q8_0").file.read_bytes() == ggufs["Tiny-Q8_0.gguf"].read_bytes()
    downloads = [r for r in cdn.requests if r["path"].endswith(".gguf")]
    assert [r["path"] for r in downloads] == ["/cdn/org/Tiny-GGUF/Tiny-Q8_0.gguf"]  # through the resolve redirect
    assert _no_partials(store)


def test_pull_by_file_and_revision(tmp_path: Path, hub: HubServer, ggufs: dict[str, Path]) -> None:
    hub.add_repo("org/Tiny-GGUF", {"sub/Tiny-F32.gguf": ggufs["Tiny-F32.gguf"], "Tiny-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"]})
    store = _store(tmp_path, hub)
    info = store.pull_hub(store.prepare_hub_pull("hf:org/Tiny-GGUF/sub/Tiny-F32.gguf@v1.0", name="mine"))
    assert info.name == "mine:f32" and info.source == "hf:org/Tiny-GGUF/sub/Tiny-F32.gguf@v1.0"
    assert any(r["path"] == "/api/models/org/Tiny-GGUF/tree/v1.0" for r in hub.requests)
    assert any(r["path"] == "/org/Tiny-GGUF/resolve/v1.0/sub/Tiny-F32.gguf" for r in hub.requests)
    with pytest.raises(BadRequest, match="no GGUF model file"):
        store.prepare_hub_pull("hf:org/Tiny-GGUF/other.gguf")
    with pytest.raises(BadRequest, match="no file of quantization Q2_K; it holds"):
        store.prepare_hub_pull("hf:org/Tiny-GGUF:Q2_K")


def test_pull_by_planner_choice_names_the_reason(tmp_path: Path, hub: HubServer, ggufs: dict[str, Path]) -> None:
    hub.add_repo("org/Tiny-GGUF", {"Tiny-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"], "Tiny-F32.gguf": ggufs["Tiny-F32.gguf"]})
    settings = make_settings(tmp_path / "data", allow_private_pull_hosts=ALLOW, hub_url=hub.url)
    (tmp_path / "data").mkdir()
    dbmod.migrate(settings.db_path)
    db = dbmod.make_engine(settings.db_path)
    store = ModelStore(settings, db, choose=hub_chooser(settings, db))
    pull = store.prepare_hub_pull("hf:org/Tiny-GGUF")
    # Both fit a tiny model on any box; the planner prefers the higher-quality one and says why.
    assert pull.variant == "f32" and pull.reason.startswith("chosen by the planner for this box: ")
    assert "F32" in pull.reason or "f32" in pull.reason
    assert store.pull_hub(pull).name == "tiny:f32"
    without_planner = _store(tmp_path / "other", hub)
    with pytest.raises(BadRequest, match="name a quantization: org/Tiny-GGUF holds"):
        without_planner.prepare_hub_pull("hf:org/Tiny-GGUF")


def test_a_mirror_at_another_address(tmp_path: Path, cdn: RangeServer, ggufs: dict[str, Path]) -> None:
    with HubServer(cdn) as upstream, HubServer(cdn) as mirror:
        upstream.add_repo("org/Tiny-GGUF", {"Tiny-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"]})
        mirror.add_repo("org/Tiny-GGUF", {"Tiny-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"]})
        store = _store(tmp_path, mirror)
        info = store.pull_hub(store.prepare_hub_pull("hf:org/Tiny-GGUF"))
        assert info.name == "tiny:q8_0" and mirror.requests and not upstream.requests


def test_a_gated_repository_needs_the_token_and_the_cdn_never_sees_it(
    tmp_path: Path, hub: HubServer, cdn: RangeServer, ggufs: dict[str, Path]
) -> None:
    hub.add_repo("org/Gated-GGUF", {"Gated-Q8_0.gguf": ggufs["Tiny-Q8_0.gguf"]}, gated=True)
    with pytest.raises(HubAccessDenied, match="gated or private; set hub_token_file") as no_token:
        _store(tmp_path / "a", hub).prepare_hub_pull("hf:org/Gated-GGUF")
    wrong = tmp_path / "wrong-token"
    wrong.write_text("hf_wrong_token_value\n")
    with pytest.raises(HubAccessDenied, match="token in hub_token_file was not accepted") as bad_token:
        _store(tmp_path / "b", hub, hub_token_file=wrong).prepare_hub_pull("hf:org/Gated-GGUF")
    assert "hf_wrong" not in str(bad_token.value.envelope()) and "hf_wrong" not in str(no_token.value.envelope())
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    store = _store(tmp_path / "c", hub, hub_token_file=good)
    info = store.pull_hub(store.prepare_hub_pull("hf:org/Gated-GGUF"))
    assert info.sha256 == sha256_file(ggufs["Tiny-Q8_0.gguf"])
    assert [r for r in hub.requests if r["authorization"] == f"Bearer {TOKEN}"]  # the hub got it ...
    assert cdn.requests and all(r["authorization"] is None for r in cdn.requests)  # ... the redirect target never did


def test_split_gguf_pull_resumes_and_totals_all_parts(
    tmp_path: Path, hub: HubServer, cdn: RangeServer, ggufs: dict[str, Path]
) -> None:
    parts = {name: path for name, path in ggufs.items() if "-of-" in name}
    assert len(parts) == 3
    hub.add_repo("org/Split-GGUF", {f"Q4_0/{name}": path for name, path in parts.items()})
    for name in parts:
        served = cdn.files[f"cdn/org/Split-GGUF/Q4_0/{name}"]
        served.delay_per_chunk, served.chunk = 0.03, 1 << 13
    store = _store(tmp_path, hub)
    pull = store.prepare_hub_pull("hf:org/Split-GGUF:Q4_0")
    total = sum(p.stat().st_size for p in parts.values())
    assert pull.name == "split:q4_0" and len(pull.files) == 3 and pull.size_bytes == total
    first_size = parts["Tiny-Q4_0-00001-of-00003.gguf"].stat().st_size
    registry = JobRegistry()
    job = registry.submit("pull", pull.name, lambda ctx: store.pull_hub(pull, ctx=ctx).to_dict())
    while job.done_bytes < first_size + (1 << 14) and not job.finished:  # into the second part
        threading.Event().wait(0.01)
    assert job.total_bytes == total  # the job's total is the sum of the parts
    registry.cancel(job.id)
    job.wait(30)
    assert job.state == "cancelled" and store.get("split:q4_0").status == "downloading"
    assert [p for p in store.settings.store_dir.rglob("*.partial")]
    for served in cdn.files.values():
        served.delay_per_chunk = 0
    info = store.pull_hub(store.prepare_hub_pull("hf:org/Split-GGUF:Q4_0"))
    resumed = [r for r in cdn.requests if r["path"].endswith("00002-of-00003.gguf")]
    assert resumed[-1]["range"] is not None  # the second part picked up where it stopped
    assert info.status == "ready" and info.size_bytes == total and _no_partials(store)
    first = store.resolve("split:q4_0").file
    assert first.name == "split-q4_0-00001-of-00003.gguf"
    for stored, name in zip(split_gguf.parts_of(first), sorted(parts), strict=True):
        assert sha256_file(stored) == sha256_file(parts[name])
    assert info.facts["parameter_count"] and info.facts["n_layer"] == 2
    assert store.verify("split:q4_0").status == "ready"
    split_gguf.parts_of(first)[2].write_bytes(b"x")  # a part changed on disk
    with pytest.raises(Exception, match="changed on disk"):
        store.resolve("split:q4_0")


def test_a_safetensors_repository_becomes_an_hf_variant(tmp_path: Path, hub: HubServer, cdn: RangeServer) -> None:
    folder = make_hf_folder(
        tmp_path / "hf",
        files={
            "generation_config.json": b"{}",
            "modeling_x.py": b"import os",
            "pytorch_model.bin": b"pickle",
            "extra/notes.txt": b"x",
            "special_tokens_map.json": b"{}",
        },
    )
    hub.add_repo("org/Tiny-HF", {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()})
    store = _store(tmp_path, hub)
    pull = store.prepare_hub_pull("hf:org/Tiny-HF")
    assert pull.name == "tiny-hf:hf" and pull.format == "safetensors"
    info = store.pull_hub(pull)
    stored = sorted(p.name for p in (store.settings.store_dir / info.path).iterdir())
    assert stored == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    fetched = {r["path"].rsplit("/", 1)[-1] for r in cdn.requests}
    assert not fetched & {"modeling_x.py", "pytorch_model.bin", "README.md", "notes.txt"}
    assert info.status == "ready" and info.facts["architecture"] and store.verify(info.name).status == "ready"
