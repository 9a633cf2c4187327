"""Every GGUF variant of a hub repository is registered by a pull: the one downloaded, the others ``available``
(name, quantization, size, source; no files). Listings come from the tree, or from the model info's siblings where
a mirror has no tree (and the reverse). Against the local hub of tests/hubkit.py and its CDN."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.errors import BadRequest, NotFound
from appliance.store import split_gguf
from appliance.store.errors import (
    HubAccessDenied,
    ModelNotDownloaded,
    Offline,
    PullNotAllowed,
    RefusedImport,
    StoreReadOnly,
    UnsafePath,
    UpstreamError,
)
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer, make_app, make_store, sha256_file

ALLOW = ["127.0.0.1"]
REPO = "org/Tiny-GGUF"


@pytest.fixture()
def cdn():
    with RangeServer() as srv:
        yield srv


@pytest.fixture()
def hub(cdn: RangeServer):
    with HubServer(cdn) as srv:
        yield srv


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three single-file quantizations and one split into three parts, beside a README."""
    base = tmp_path_factory.mktemp("hub-variants")
    first = make_tiny_gguf(base / "split" / "Tiny-Q4_0.gguf", vocab=1024, n_embd=128, seed=4, split_max_tensors=8)
    (base / "README.md").write_text("# Tiny\n")
    return {
        "Tiny-Q8_0.gguf": make_tiny_gguf(base / "q8.gguf", seed=1),
        "Tiny-F16.gguf": make_tiny_gguf(base / "f16.gguf", vocab=768, seed=2),
        "Tiny-F32.gguf": make_tiny_gguf(base / "f32.gguf", vocab=1024, seed=3),
        **{f"Q4_0/{p.name}": p for p in split_gguf.parts_of(first)},
        "README.md": base / "README.md",
    }


def _store(data: Path, hub: HubServer, **overrides: object) -> ModelStore:
    return make_store(data, allow_private_pull_hosts=ALLOW, hub_url=hub.url, **overrides)


def _split_size(files: dict[str, Path]) -> int:
    return sum(p.stat().st_size for name, p in files.items() if name.startswith("Q4_0/"))


def _states(store: ModelStore) -> dict[str, tuple[str, int]]:
    return {i.name: (i.status, i.size_bytes) for i in store.list()}


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(folder)): (os.lstat(p).st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
        for p in sorted(folder.rglob("*"))
    }


def _expected(files: dict[str, Path], downloaded: str) -> dict[str, tuple[str, int]]:
    sizes = {
        "tiny:q8_0": files["Tiny-Q8_0.gguf"].stat().st_size,
        "tiny:f16": files["Tiny-F16.gguf"].stat().st_size,
        "tiny:f32": files["Tiny-F32.gguf"].stat().st_size,
        "tiny:q4_0": _split_size(files),
    }
    return {name: ("ready" if name == downloaded else "available", size) for name, size in sizes.items()}


def test_a_pull_registers_every_variant_and_an_available_one_is_pulled_later(
    tmp_path: Path, hub: HubServer, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    hub.add_repo(REPO, repo_files)
    store = _store(tmp_path / "data", hub)
    pulled = store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:q8_0"))
    assert pulled.name == "tiny:q8_0" and pulled.is_default
    assert _states(store) == _expected(repo_files, "tiny:q8_0")  # 4 variants: 1 downloaded, 3 available
    available = {i.name: i for i in store.list() if i.available}
    assert available["tiny:q4_0"].source == f"hf:{REPO}/Q4_0/Tiny-Q4_0-00001-of-00003.gguf"  # the split set is one variant
    assert available["tiny:f16"].quantization == "F16" and available["tiny:f16"].path == ""
    assert not any(i.is_default for i in available.values())
    assert [r["path"] for r in cdn.requests] == [f"/cdn/{REPO}/Tiny-Q8_0.gguf"]  # nothing else was downloaded
    assert sorted(p.name for p in (store.settings.store_dir / "tiny").iterdir()) == ["q8_0"]
    with pytest.raises(ModelNotDownloaded, match="available on the hub but not downloaded"):
        store.resolve("tiny:f32")
    for refused in (
        lambda: store.verify("tiny:f32"),
        lambda: store.set_default("tiny:f32"),
        lambda: store.export_bundle("tiny:f32"),
    ):
        with pytest.raises(ModelNotDownloaded):
            refused()
    assert store.resolve("tiny").name == "tiny:q8_0"

    again = store.prepare_requested_pull(None, "tiny:q4_0")  # an available variant is pulled by its name
    assert again is not None and again.name == "tiny:q4_0" and len(again.files) == 3
    split = store.pull_hub(again)
    assert split.status == "ready" and split.size_bytes == _split_size(repo_files)
    stored = split_gguf.parts_of(store.resolve("tiny:q4_0").file)
    assert [sha256_file(p) for p in stored] == [
        sha256_file(repo_files[f"Q4_0/Tiny-Q4_0-0000{n}-of-00003.gguf"]) for n in (1, 2, 3)
    ]
    assert store.verify("tiny:q4_0").status == "ready"
    assert {n: s for n, (s, _size) in _states(store).items()} == {
        "tiny:q8_0": "ready",
        "tiny:q4_0": "ready",
        "tiny:f16": "available",
        "tiny:f32": "available",
    }
    assert store.get("tiny").name == "tiny:q8_0"  # the default stays

    store.delete("tiny:f16")  # an available variant is forgotten alone
    assert set(_states(store)) == {"tiny:q8_0", "tiny:q4_0", "tiny:f32"}
    store.delete("tiny:q8_0")
    assert store.get("tiny").name == "tiny:q4_0"  # the next default is an installed variant, never an available one
    store.delete("tiny:q4_0")  # the repository's last model: its available variants go with it
    assert store.list() == [] and not (store.settings.store_dir / "tiny").exists()


def test_the_admin_api_lists_available_variants_with_their_fit_and_pulls_one_by_name(
    tmp_path: Path, hub: HubServer, repo_files: dict[str, Path]
) -> None:
    hub.add_repo(REPO, repo_files)
    store = _store(tmp_path / "data", hub)
    store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:f16"))
    jobs = JobRegistry()
    with TestClient(make_app(store, jobs)) as client:
        listed = {m["name"]: m for m in client.get("/admin/models/").json()}
        assert {n: m["status"] for n, m in listed.items()} == {
            "tiny:f16": "ready",
            "tiny:q8_0": "available",
            "tiny:f32": "available",
            "tiny:q4_0": "available",
        }
        assert listed["tiny:q4_0"]["size_bytes"] == _split_size(repo_files)
        fit = listed["tiny:q8_0"]["fit"]  # planned from the downloaded variant's architecture and the listed size
        assert fit["fits"] is True and fit["backend"] == "llamacpp" and fit["reason"]
        assert "fit" not in listed["tiny:f16"]
        refused = client.post("/admin/models/pull", json={"name": "tiny:q8_0", "sha256": "0" * 64})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "sha256"
        started = client.post("/admin/models/pull", json={"name": "tiny:q8_0"})
        assert started.status_code == 202, started.text
        assert started.json()["hub"]["source"] == f"hf:{REPO}/Tiny-Q8_0.gguf"
        job = jobs.get(started.json()["id"])
        job.wait(60)
        assert job.state == "done", job.message
        assert store.get("tiny:q8_0").sha256 == sha256_file(repo_files["Tiny-Q8_0.gguf"])
        gone = client.post("/admin/models/tiny:f32/verify")
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "model_not_downloaded"


def test_a_failed_pull_of_an_available_variant_leaves_it_available(
    tmp_path: Path, hub: HubServer, repo_files: dict[str, Path]
) -> None:
    hub.add_repo(REPO, repo_files, listed_sha256={"Tiny-F32.gguf": "ab" * 32})  # the hub lists a wrong hash
    store = _store(tmp_path / "data", hub)
    store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:q8_0"))
    pull = store.prepare_requested_pull(None, "tiny:f32")
    assert pull is not None
    with pytest.raises(BadRequest, match="sha256 mismatch"):
        store.pull_hub(pull)
    assert _states(store)["tiny:f32"] == ("available", repo_files["Tiny-F32.gguf"].stat().st_size)
    assert not list(store.settings.store_dir.rglob("*.partial"))


@pytest.mark.parametrize("status", [404, 501])
def test_without_the_tree_endpoint_the_siblings_list_the_files_and_a_head_gives_their_sizes(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path], status: int
) -> None:
    with HubServer(cdn, tree_status=status, sibling_sizes=False) as mirror:
        mirror.add_repo(REPO, repo_files)
        store = _store(tmp_path / "data", mirror)
        pull = store.prepare_hub_pull(f"hf:{REPO}:q4_0@v1.0")
        listed = {f["path"]: (f["size_bytes"], f["sha256"]) for v in pull.to_dict()["variants"] for f in v["files"]}
        assert listed == {path: (p.stat().st_size, sha256_file(p)) for path, p in repo_files.items() if path.endswith(".gguf")}
        info = store.pull_hub(pull)
        assert info.status == "ready" and info.size_bytes == _split_size(repo_files)
        paths = [(r["method"], r["path"]) for r in mirror.requests]
        assert ("GET", f"/api/models/{REPO}/tree/v1.0") in paths and ("GET", f"/api/models/{REPO}/revision/v1.0") in paths
        heads = {p for m, p in paths if m == "HEAD"}
        assert heads == {f"/{REPO}/resolve/v1.0/{path}" for path in repo_files if path.endswith(".gguf")}  # not the README
    assert {n: s for n, (s, _size) in _states(store).items()} == {
        "tiny:q4_0": "ready",
        "tiny:q8_0": "available",
        "tiny:f16": "available",
        "tiny:f32": "available",
    }
    assert store.get("tiny:f32").source == f"hf:{REPO}/Tiny-F32.gguf@v1.0"


def test_siblings_with_sizes_need_no_head(tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path]) -> None:
    with HubServer(cdn, tree_status=501) as mirror:
        mirror.add_repo(REPO, repo_files)
        store = _store(tmp_path / "data", mirror)
        assert store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:f32")).sha256 == sha256_file(repo_files["Tiny-F32.gguf"])
        assert ("GET", f"/api/models/{REPO}") in [(r["method"], r["path"]) for r in mirror.requests]
        assert not [r for r in mirror.requests if r["method"] == "HEAD"]
    assert len(store.list()) == 4


def test_without_the_model_info_endpoint_the_tree_lists_the_files(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    with HubServer(cdn, info_status=404) as mirror:
        mirror.add_repo(REPO, repo_files)
        store = _store(tmp_path / "data", mirror)
        assert store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:q8_0")).status == "ready"
        assert [r["path"] for r in mirror.requests if r["path"].startswith("/api/")] == [f"/api/models/{REPO}/tree/main"]
    assert len(store.list()) == 4


def test_a_mirror_with_neither_listing_and_an_unknown_repository_are_clear_errors(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    with HubServer(cdn, tree_status=501, info_status=501) as mirror:
        mirror.add_repo(REPO, repo_files)
        with pytest.raises(UpstreamError, match="neither in a tree nor in its model info .*tree: HTTP 501.*model info: HTTP 501"):
            _store(tmp_path / "a", mirror).prepare_hub_pull(f"hf:{REPO}")
    with HubServer(cdn, tree_status=404) as mirror, pytest.raises(NotFound, match="the hub has no repository org/Nothing"):
        _store(tmp_path / "b", mirror).prepare_hub_pull("hf:org/Nothing")


@pytest.mark.parametrize("tree_status", [None, 501])
def test_a_repository_without_gguf_files_is_a_clear_error(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path], tree_status: int | None
) -> None:
    with HubServer(cdn, tree_status=tree_status) as mirror:
        mirror.add_repo("org/Docs", {"README.md": repo_files["README.md"]})
        store = _store(tmp_path / "data", mirror)
        with pytest.raises(BadRequest, match="org/Docs holds no GGUF files"):
            store.prepare_hub_pull("hf:org/Docs:q4_0")
        with pytest.raises(RefusedImport, match="neither GGUF files nor safetensors weights"):
            store.prepare_hub_pull("hf:org/Docs")
    assert store.list() == []


def test_offline_and_read_only_stores_list_available_variants_but_neither_reach_out_nor_write(
    tmp_path: Path, hub: HubServer, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    hub.add_repo(REPO, repo_files)
    data = tmp_path / "data"
    online = _store(data, hub)
    online.pull_hub(online.prepare_hub_pull(f"hf:{REPO}:q8_0"))
    online.db.dispose()
    seen = len(hub.requests) + len(cdn.requests)

    offline = _store(data, hub, offline=True)
    assert _states(offline) == _expected(repo_files, "tiny:q8_0")
    with pytest.raises(Offline):
        offline.prepare_requested_pull(None, "tiny:f16")
    with pytest.raises(Offline):
        offline.pull_hub(online.prepare_hub_pull(f"hf:{REPO}:f16"))
    seen = len(hub.requests) + len(cdn.requests)
    with pytest.raises(Offline):
        offline.prepare_requested_pull(None, "tiny:f32")
    assert len(hub.requests) + len(cdn.requests) == seen  # no connection made offline
    offline.db.dispose()

    before = _snapshot(data / "models")
    read_only = _store(data, hub, store_read_only=True)
    read_only.register_found()  # the files of tiny:q8_0 are there; the available variants never had any
    assert _states(read_only) == _expected(repo_files, "tiny:q8_0")
    for refused in (lambda: read_only.prepare_requested_pull(None, "tiny:f16"), lambda: read_only.delete("tiny:f16")):
        with pytest.raises(StoreReadOnly):
            refused()
    assert _snapshot(data / "models") == before and len(hub.requests) + len(cdn.requests) == seen


@pytest.mark.parametrize(
    "hostile",
    [
        {"rfilename": "../../escape-Q2_K.gguf"},
        {"rfilename": "/etc/Tiny-Q2_K.gguf"},
        {"rfilename": "sub/\x00Tiny-Q2_K.gguf"},
        {"rfilename": "Tiny-Q2_K.gguf", "size": -5},
    ],
)
def test_a_hostile_siblings_listing_is_refused_whole(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path], hostile: dict[str, object]
) -> None:
    with HubServer(cdn, tree_status=501) as mirror:
        mirror.add_repo(REPO, repo_files, extra_siblings=[hostile])
        store = _store(tmp_path / "data", mirror)
        with pytest.raises((UnsafePath, UpstreamError)):
            store.prepare_hub_pull(f"hf:{REPO}:q8_0")
    assert store.list() == [] and not cdn.requests
    assert not [p for p in tmp_path.rglob("*") if "escape" in p.name]


def test_a_gated_mirror_without_the_tree_gets_the_token_and_its_cdn_never_does(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    token = "hf_canary_5e0c1b7a9d3f2468"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    with HubServer(cdn, token=token, tree_status=404, sibling_sizes=False) as mirror:
        mirror.add_repo(REPO, repo_files, gated=True)
        with pytest.raises(HubAccessDenied):
            _store(tmp_path / "no-token", mirror).prepare_hub_pull(f"hf:{REPO}:q8_0")
        store = _store(tmp_path / "data", mirror, hub_token_file=token_file)
        assert store.pull_hub(store.prepare_hub_pull(f"hf:{REPO}:q8_0")).status == "ready"
        heads = [r for r in mirror.requests if r["method"] == "HEAD"]
        assert heads and all(r["authorization"] == f"Bearer {token}" for r in heads)
    assert cdn.requests and all(r["authorization"] is None for r in cdn.requests)
    assert len(store.list()) == 4


def test_a_head_redirect_to_an_address_not_allowed_is_refused(
    tmp_path: Path, cdn: RangeServer, repo_files: dict[str, Path]
) -> None:
    with HubServer(cdn, tree_status=501, sibling_sizes=False, head_location="http://[::1]:9/metadata") as mirror:
        mirror.add_repo(REPO, repo_files)
        store = _store(tmp_path / "data", mirror)  # 127.0.0.1 is allowed, ::1 is not
        with pytest.raises(PullNotAllowed, match="pulls may not reach ::1"):
            store.prepare_hub_pull(f"hf:{REPO}:q8_0")
    assert store.list() == []
