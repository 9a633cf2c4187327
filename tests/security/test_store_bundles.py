"""Offline bundles: export, then import with no network; a hostile tar is refused whole and writes nothing.

reliability-table rows 4 (traversal: absolute names, ``..``, links, devices) and 15 (sizes and sha256
checked against the manifest before anything becomes visible) for the bundle path.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from appliance.errors import BadRequest
from appliance.store import split_gguf
from appliance.store.bundles import bundle_stream
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_hf_folder, make_store, sha256_file


def _write(path: Path, store: ModelStore, name: str) -> Path:
    manifest, files = store.export_bundle(name)
    with path.open("wb") as out:
        for chunk in bundle_stream(manifest, files):
            out.write(chunk)
    return path


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def _stored_files(store: ModelStore) -> list[Path]:
    return [p for p in store.settings.store_dir.rglob("*") if p.is_file()]


@pytest.mark.parametrize("kind", ["gguf", "split", "safetensors"])
def test_export_then_offline_import_gives_the_same_variant(tmp_path: Path, kind: str) -> None:
    source = make_store(tmp_path / "a")
    if kind == "gguf":
        info = source.import_path(str(make_tiny_gguf(tmp_path / "tiny-f32.gguf")))
    elif kind == "split":
        first = make_tiny_gguf(tmp_path / "split" / "m.gguf", split_max_tensors=8)
        info = source.import_path(str(_install_split(tmp_path, first)), name="split:f32")
    else:
        info = source.import_path(str(make_hf_folder(tmp_path / "tiny-hf")), name="tiny-hf:bf16")
    if kind == "split":
        info = source.get("split:f32")
    bundle = _write(tmp_path / "m.tar", source, info.name)
    target = make_store(tmp_path / "b", offline=True)
    imported = target.import_path(str(bundle))
    assert (imported.name, imported.sha256, imported.size_bytes, imported.format) == (
        info.name,
        info.sha256,
        info.size_bytes,
        info.format,
    )
    assert imported.source == f"bundle:{info.source}" and imported.status == "ready"
    assert target.verify(imported.name).status == "ready"
    assert not [p for p in target.settings.store_dir.rglob("*") if ".partial" in p.name or p.name.startswith("bundle-")]


def _install_split(tmp_path: Path, first: Path) -> Path:
    """A split model can only arrive by hub pull or bundle: make its bundle by hand, as an exporter would."""
    parts = split_gguf.parts_of(first)
    manifest = {
        "kind": "llm-appliance-bundle",
        "version": 1,
        "name": "split:f32",
        "family": "split",
        "variant": "f32",
        "format": "gguf",
        "quantization": None,
        "source": "hf:org/Split",
        "sha256": None,
        "files": [{"path": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)} for p in parts],
    }
    path = tmp_path / "split.tar"
    with path.open("wb") as out:
        for chunk in bundle_stream(manifest, [(p.name, p) for p in parts]):
            out.write(chunk)
    return path


# ---------------------------------------------------------------- hostile bundles
def _tar(path: Path, manifest: dict[str, Any] | None, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        if manifest is not None:
            body = json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def _manifest(files: dict[str, bytes], fmt: str = "gguf", **extra: Any) -> dict[str, Any]:
    return {
        "kind": "llm-appliance-bundle",
        "version": 1,
        "family": "evil",
        "variant": "f32",
        "format": fmt,
        **extra,
        "files": [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()],
    }


def _link(name: str, kind: bytes, target: str = "/etc/passwd") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return make_tiny_gguf(tmp_path_factory.mktemp("b") / "m.gguf").read_bytes()


def _hostile(gguf: bytes) -> dict[str, tuple[dict[str, Any] | None, list[tarfile.TarInfo | tuple[str, bytes]]]]:
    ok = {"m.gguf": gguf}
    return {
        "absolute member": (_manifest(ok), [("/tmp/m.gguf", gguf)]),
        "dotdot member": (_manifest(ok), [("files/../../m.gguf", gguf)]),
        "dotdot in manifest": (_manifest({"../m.gguf": gguf}), [("files/../m.gguf", gguf)]),
        "absolute in manifest": (_manifest({"/etc/m.gguf": gguf}), [("files//etc/m.gguf", gguf)]),
        "symlink": (_manifest(ok), [_link("files/m.gguf", tarfile.SYMTYPE)]),
        "hardlink": (_manifest(ok), [_link("files/m.gguf", tarfile.LNKTYPE)]),
        "device": (_manifest(ok), [_link("files/m.gguf", tarfile.CHRTYPE, "")]),
        "fifo": (_manifest(ok), [_link("files/m.gguf", tarfile.FIFOTYPE, "")]),
        "folder": (_manifest(ok), [_link("files/m.gguf", tarfile.DIRTYPE, "")]),
        "size differs": (
            _manifest({"m.gguf": gguf + b"x"})
            | {"files": [{"path": "m.gguf", "size": len(gguf) - 1, "sha256": hashlib.sha256(gguf).hexdigest()}]},
            [("files/m.gguf", gguf)],
        ),
        "sha256 differs": (
            _manifest({"m.gguf": gguf + b"x"}) | {"files": [{"path": "m.gguf", "size": len(gguf), "sha256": "ab" * 32}]},
            [("files/m.gguf", gguf)],
        ),
        "member not in manifest": (_manifest(ok), [("files/m.gguf", gguf), ("files/other.gguf", gguf)]),
        "member missing": (_manifest(ok | {"m2.gguf": gguf}), [("files/m.gguf", gguf)]),
        "member twice": (_manifest(ok), [("files/m.gguf", gguf), ("files/m.gguf", gguf)]),
        "no manifest first": (None, [("files/m.gguf", gguf)]),
        "code in a folder": (
            _manifest({"config.json": b"{}", "model.safetensors": b"x", "modeling.py": b"import os"}, fmt="safetensors"),
            [],
        ),
        "pickle in a folder": (_manifest({"config.json": b"{}", "pytorch_model.bin": b"x"}, fmt="safetensors"), []),
        "bad model name": (_manifest(ok) | {"family": "../evil"}, [("files/m.gguf", gguf)]),
        "not gguf": (_manifest({"m.py": b"import os"}), [("files/m.py", b"import os")]),
    }


@pytest.mark.parametrize("case", list(_hostile(b"GGUF").keys()))
def test_hostile_bundles_are_refused_and_write_nothing(tmp_path: Path, gguf_bytes: bytes, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    before = _snapshot(outside)
    manifest, members = _hostile(gguf_bytes)[case]
    bundle = _tar(tmp_path / "evil.tar", manifest, members)
    store = make_store(tmp_path / "data", offline=True)
    with pytest.raises(BadRequest):
        store.import_path(str(bundle))
    assert store.list() == [] and _stored_files(store) == []
    assert _snapshot(outside) == before and not (tmp_path / "m.gguf").exists() and not Path("/tmp/m.gguf").exists()


def test_a_corrupt_variant_is_not_exported(tmp_path: Path) -> None:
    store = make_store(tmp_path / "a")
    info = store.import_path(str(make_tiny_gguf(tmp_path / "tiny-f32.gguf")))
    path = store.resolve(info.name).file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="no longer match"):
        store.export_bundle(info.name)
