"""A bundle's manifest: what it was made for and the sha256 of every member, and the checks that refuse it.

``manifest.json`` sits at the top of the bundle beside ``wheels/``, ``debs/`` and ``src/``. A bundle is
refused (:class:`BundleRefused`, whose message is the reason) when the manifest is missing or of an
unknown format, when a member is missing, changed (size or sha256) or not listed, or when the box is not
the one the bundle was made for (operating system and version, CPU architecture, Python ABI): the wheels
hold native code built for that combination.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = 1
MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20

# Where the steps say what they do: print, or click.echo in appliancectl.
Log = Callable[[str], object]


class BundleRefused(Exception):
    """The bundle must not be installed; the message says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Platform:
    """What a bundle's native code needs: the OS release, the CPU architecture and the Python ABI."""

    os_id: str
    os_version: str
    arch: str
    python: str

    def describe(self) -> str:
        return f"{self.os_id} {self.os_version}, {self.arch}, {self.python}"


@dataclass(frozen=True)
class Member:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    version: str
    flavour: str
    platform: Platform
    built_at: str
    build_id: str
    members: tuple[Member, ...]
    debs: tuple[str, ...] = ()
    format: int = FORMAT
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        body = asdict(self)
        body["members"] = [asdict(m) for m in self.members]
        body["debs"] = list(self.debs)
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise BundleRefused(f"{MANIFEST_NAME} is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise BundleRefused(f"{MANIFEST_NAME} is not a JSON object")
        if body.get("format") != FORMAT:
            raise BundleRefused(f"{MANIFEST_NAME} has format {body.get('format')!r}; this installer reads format {FORMAT}")
        try:
            return cls(
                version=str(body["version"]),
                flavour=str(body["flavour"]),
                platform=Platform(**{k: str(v) for k, v in body["platform"].items()}),
                built_at=str(body["built_at"]),
                build_id=str(body["build_id"]),
                members=tuple(Member(str(m["path"]), str(m["sha256"]), int(m["size"])) for m in body["members"]),
                debs=tuple(str(d) for d in body.get("debs", [])),
                extra={str(k): str(v) for k, v in body.get("extra", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleRefused(f"{MANIFEST_NAME} is incomplete or malformed ({type(exc).__name__}: {exc})") from None


def this_platform(os_release: Path = Path("/etc/os-release")) -> Platform:
    """The running box: ID and VERSION_ID from os-release, the machine's architecture, this Python's ABI."""
    fields: dict[str, str] = {}
    try:
        for line in os_release.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                fields[key.strip()] = value.strip().strip('"')
    except OSError:
        pass
    python = f"{sys.implementation.name[:2]}{sys.version_info.major}{sys.version_info.minor}"
    return Platform(fields.get("ID", "unknown"), fields.get("VERSION_ID", "unknown"), platform.machine(), python)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_below(root: Path) -> list[str]:
    """Every file below ``root`` as a relative POSIX path, sorted, the manifest itself left out."""
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST_NAME
    )


def describe_members(root: Path, verified: tuple[Member, ...] = ()) -> tuple[Member, ...]:
    """Every file below ``root`` with its sha256 and size; a file in ``verified`` (just checked, same size) is not read again."""
    known = {m.path: m for m in verified}
    members = []
    for name in files_below(root):
        size = (root / name).stat().st_size
        same = known.get(name)
        members.append(same if same is not None and same.size == size else Member(name, sha256_of(root / name), size))
    return tuple(members)


def check_platform(manifest: Manifest, here: Platform) -> None:
    want = manifest.platform
    for label, made_for, box in (
        ("operating system", f"{want.os_id} {want.os_version}", f"{here.os_id} {here.os_version}"),
        ("CPU architecture", want.arch, here.arch),
        ("Python ABI", want.python, here.python),
    ):
        if made_for != box:
            raise BundleRefused(f"the bundle was made for {label} {made_for}, this box has {box}; make one on a {box} machine")


def check_members(manifest: Manifest, root: Path) -> None:
    """Every listed member present with its size and sha256, and nothing unlisted beside them."""
    listed = {m.path for m in manifest.members}
    if len(listed) != len(manifest.members):
        raise BundleRefused(f"{MANIFEST_NAME} lists a member twice")
    for member in manifest.members:
        path = root / member.path
        if not path.is_file() or path.is_symlink():
            raise BundleRefused(f"member {member.path} is listed in {MANIFEST_NAME} but missing from the bundle")
        size = path.stat().st_size
        if size != member.size:
            raise BundleRefused(
                f"member {member.path} has {size} bytes, {MANIFEST_NAME} says {member.size}: the bundle was changed"
            )
        if sha256_of(path) != member.sha256:
            raise BundleRefused(f"member {member.path} does not match its sha256 in {MANIFEST_NAME}: the bundle was changed")
    unlisted = [name for name in files_below(root) if name not in listed]
    if unlisted:
        raise BundleRefused(f"member {unlisted[0]} is not listed in {MANIFEST_NAME} ({len(unlisted)} unlisted in all)")


def verify(root: Path, here: Platform | None = None) -> Manifest:
    """The manifest of the unpacked bundle in ``root``, once every check passed; else :class:`BundleRefused`."""
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleRefused(f"the bundle has no {MANIFEST_NAME}")
    manifest = Manifest.from_json(path.read_text())
    check_platform(manifest, here or this_platform())
    check_members(manifest, root)
    return manifest
