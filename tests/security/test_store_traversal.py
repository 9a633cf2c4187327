"""reliability-table row 4: path traversal through every store path that takes a name or a path.

``../``, ``%2e%2e``, absolute paths, NUL bytes and symlinks, through import,
delete, verify, inspect, quantize, default and the pull name → 4xx (or a typed
error), and nothing written or deleted outside the store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.db import engine as dbmod
from appliance.db.tables import ModelVariant
from appliance.errors import ApplianceError, BadRequest
from appliance.store.jobs import JobRegistry
from appliance.store.paths import UnsafePath, parse_name
from appliance.store.store import ModelStore
from tests.storekit import make_app, make_hf_folder, make_store

BAD_NAMES = [
    "../evil",
    "..",
    "a/../../evil",
    "%2e%2e",
    "%2e%2e%2fevil",
    "/etc/passwd",
    "tiny:../../evil",
    "tiny:..",
    "tiny:/abs",
    "ti\x00ny",
    "tiny:f32\x00.gguf",
    ".hidden",
    "tiny:.partial",
    "Tiny",
    "a" * 65,
    "tiny:a:b",
    "tiny\\..\\evil",
    "",
    ":",
    "tiny:",
    " tiny",
]
HTTP_BAD_PATHS = [
    "..",
    "%2e%2e",
    "%2E%2E",
    "..%2F..%2Fevil",
    "%2e%2e%2f%2e%2e%2fevil",
    "tiny:%2e%2e",
    "%2Fetc%2Fpasswd",
    "tiny%00",
    "tiny:f32%00",
    "..%5C..%5Cevil",
    "~root",
]


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[tuple[ModelStore, Path]]:
    """A store, plus a folder outside it whose contents must never change."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.gguf").write_bytes(b"GGUF precious")
    (outside / "evil").mkdir()
    (outside / "evil" / "keep.txt").write_text("keep")
    store = make_store(tmp_path / "data")
    yield store, outside


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_by_the_parser(name: str) -> None:
    with pytest.raises(BadRequest):
        parse_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_every_store_entry_point_refuses_bad_names(world: tuple[ModelStore, Path], tiny_gguf: Path, name: str) -> None:
    store, outside = world
    before = snapshot(outside)
    calls = [
        lambda: store.import_path(str(tiny_gguf), name=name),
        lambda: store.prepare_pull("http://93.184.216.34/x.gguf", name=name),
        lambda: store.delete(name),
        lambda: store.verify(name),
        lambda: store.get(name),
        lambda: store.resolve(name),
        lambda: store.set_default(name),
        lambda: store.quantize(name, "q8_0"),
    ]
    for call in calls:
        with pytest.raises(ApplianceError) as info:
            call()
        assert 400 <= info.value.status < 500
        assert "\x00" not in info.value.message
    assert snapshot(outside) == before
    assert store.list() == []


def test_http_paths_with_encoded_traversal(world: tuple[ModelStore, Path], tiny_gguf: Path) -> None:
    store, outside = world
    store.import_path(str(tiny_gguf), name="tiny:f32")
    before, store_before = snapshot(outside), snapshot(store.settings.store_dir)
    jobs = JobRegistry()
    with TestClient(make_app(store, jobs)) as client:
        for bad in HTTP_BAD_PATHS:
            for method, suffix in (("DELETE", ""), ("GET", ""), ("POST", "/verify"), ("POST", "/default")):
                r = client.request(method, f"/admin/models/{bad}{suffix}")
                assert 400 <= r.status_code < 500, (method, bad, r.status_code)
            r = client.post(f"/admin/models/{bad}/quantize", json={"to": "q8_0"})
            assert 400 <= r.status_code < 500
            for body in ({"path": str(tiny_gguf), "name": bad}, {"path": f"{outside}/{bad}"}):
                assert 400 <= client.post("/admin/models/import", json=body).status_code < 500
            assert (
                400
                <= client.post("/admin/models/pull", json={"url": "http://93.184.216.34/x.gguf", "name": bad}).status_code
                < 500
            )
    jobs.shutdown()
    assert snapshot(outside) == before
    assert snapshot(store.settings.store_dir) == store_before
    assert [i.name for i in store.list()] == ["tiny:f32"]


@pytest.mark.parametrize("path", ["relative/model.gguf", "model.gguf", "", "/nonexistent/x.gguf", "/tmp/a\x00b.gguf"])
def test_import_paths_must_be_absolute_existing_and_clean(world: tuple[ModelStore, Path], path: str) -> None:
    store, _ = world
    with pytest.raises(BadRequest):
        store.import_path(path)


def test_import_refuses_a_symlinked_source(world: tuple[ModelStore, Path], tiny_gguf: Path, tmp_path: Path) -> None:
    store, _ = world
    link = tmp_path / "link.gguf"
    link.symlink_to(tiny_gguf)
    with pytest.raises(BadRequest, match="symlink"):
        store.import_path(str(link), name="tiny:f32")
    folder = make_hf_folder(tmp_path / "hf")
    (folder / "extra.json").symlink_to("/etc/passwd")
    with pytest.raises(BadRequest, match="symlink"):
        store.import_path(str(folder), name="tiny:bf16")
    assert store.list() == [] and not list(store.settings.store_dir.rglob("*.gguf"))


def test_import_refuses_a_path_inside_the_store(world: tuple[ModelStore, Path], tiny_gguf: Path) -> None:
    store, _ = world
    info = store.import_path(str(tiny_gguf), name="tiny:f32")
    with pytest.raises(BadRequest):
        store.import_path(str(store.settings.store_dir / info.path), name="tiny:copy")


def test_a_symlink_planted_in_the_store_is_never_followed(world: tuple[ModelStore, Path], tiny_gguf: Path) -> None:
    store, outside = world
    before = snapshot(outside)
    # The family folder is a link to a folder outside: installs under it must not write there.
    (store.settings.store_dir / "evil").symlink_to(outside / "evil", target_is_directory=True)
    with pytest.raises(UnsafePath):
        store.import_path(str(tiny_gguf), name="evil:f32")
    # A variant folder that became a link after install: verify, resolve and delete refuse, the target survives.
    store.import_path(str(tiny_gguf), name="tiny:f32")
    vdir = store.settings.store_dir / "tiny" / "f32"
    for child in vdir.iterdir():
        child.unlink()
    vdir.rmdir()
    vdir.symlink_to(outside, target_is_directory=True)
    for call in (lambda: store.verify("tiny:f32"), lambda: store.resolve("tiny:f32"), lambda: store.delete("tiny:f32")):
        with pytest.raises(UnsafePath):
            call()
    assert snapshot(outside) == before


def test_a_tampered_database_path_is_rechecked(world: tuple[ModelStore, Path], tiny_gguf: Path) -> None:
    store, outside = world
    info = store.import_path(str(tiny_gguf), name="tiny:f32")
    for evil in ("../../outside/victim.gguf", str(outside / "victim.gguf"), "tiny/../../outside/victim.gguf"):
        with dbmod.session(store.db) as s:
            row = s.get(ModelVariant, info.id)
            row.path = evil
            s.add(row)
            s.commit()
        for call in (lambda: store.resolve("tiny:f32"), lambda: store.verify("tiny:f32")):
            with pytest.raises(UnsafePath):
                call()
    assert (outside / "victim.gguf").read_bytes() == b"GGUF precious"


def test_store_folders_are_not_world_readable(world: tuple[ModelStore, Path], tiny_gguf: Path) -> None:
    store, _ = world
    store.import_path(str(tiny_gguf), name="tiny:f32")
    assert os.stat(store.settings.store_dir / "tiny" / "f32").st_mode & 0o007 == 0


# ---------------------------------------------------------------- names from a hub's listing
HOSTILE_LISTED_PATHS = [
    "../x.gguf",
    "/etc/x.gguf",
    "a/../../x.gguf",
    "..",
    "sub/./x.gguf",
    "a//x.gguf",
    "..\\x.gguf",
    "x\x00.gguf",
    "sub/../../../outside/victim.gguf",
]


@pytest.mark.parametrize("listed", HOSTILE_LISTED_PATHS)
def test_a_hub_listing_naming_an_unsafe_path_is_refused_whole(
    tmp_path: Path, world: tuple[ModelStore, Path], tiny_gguf: Path, listed: str
) -> None:
    from tests.hubkit import HubServer
    from tests.storekit import RangeServer

    _store, outside = world
    before = snapshot(outside)
    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo(
            "org/Evil-GGUF",
            {"Evil-Q8_0.gguf": tiny_gguf},
            extra_entries=[{"type": "file", "path": listed, "size": 10, "lfs": {"oid": "0" * 64, "size": 10}}],
        )
        store = make_store(tmp_path / "hubdata", allow_private_pull_hosts=["127.0.0.1"], hub_url=hub.url)
        for spec in ("hf:org/Evil-GGUF", "hf:org/Evil-GGUF:Q8_0"):
            with pytest.raises(UnsafePath, match="unsafe path|no valid path"):
                store.prepare_hub_pull(spec)
        assert not [r for r in cdn.requests]  # nothing was downloaded
    assert store.list() == [] and snapshot(outside) == before


@pytest.mark.parametrize(
    "spec",
    [
        "hf:org/repo/../x.gguf",
        "hf:org/repo//etc/x.gguf",
        "hf:../repo",
        "hf:org/..",
        "hf:org/repo/a/../../x.gguf",
        "hf:org/repo:../x",
        "hf:org/repo@../main",
        "hf:org/re\x00po",
    ],
)
def test_hub_specs_with_traversal_are_refused_before_any_request(tmp_path: Path, spec: str) -> None:
    store = make_store(tmp_path / "data", hub_url="http://127.0.0.1:9")  # nothing listens there: no request may be made
    with pytest.raises(BadRequest):
        store.prepare_hub_pull(spec)
