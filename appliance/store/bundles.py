"""Offline bundles: one tar that carries a variant to a box without network.

A bundle is an uncompressed tar: ``manifest.json`` first (the variant's name,
format, quantization, source, catalog facts, and every file with its size and
sha256), then each file as ``files/<path>``. :func:`bundle_stream` writes one
after hashing the variant's files again (a variant that no longer matches its
recorded sha256 is not exported). :func:`unpack_bundle` reads one with no
network: only regular-file members named in the manifest, each once, with the
manifest's size, written into a folder of the store's trash and hashed on the
way; absolute names, ``..``, links, devices, unknown or missing members and
any size or sha256 mismatch refuse the whole bundle. The files then go through
the store's one install path (inspection, the import policy, atomic rename), so
nothing is visible before everything is verified.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from appliance.errors import BadRequest, Conflict
from appliance.jsontypes import JsonObject
from appliance.store import imports as imp
from appliance.store import split_gguf
from appliance.store.errors import ChecksumMismatch, RefusedImport
from appliance.store.hub.spec import check_repo_path
from appliance.store.jobs import JobContext
from appliance.store.paths import check_part
from appliance.store.variants import ResolvedVariant

KIND = "llm-appliance-bundle"
VERSION = 1
MANIFEST = "manifest.json"
PREFIX = "files/"
MAX_MANIFEST = 16 << 20
BLOCK = 512
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the variant: the GGUF file name, or a path inside the HF folder
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    family: str
    variant: str
    format: str  # gguf | safetensors
    files: tuple[BundleFile, ...]
    source: str | None
    quantization: str | None

    @property
    def name(self) -> str:
        return f"{self.family}:{self.variant}"

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


def is_bundle(path: Path) -> bool:
    """A tar file (ustar magic) rather than a GGUF file."""
    try:
        with path.open("rb") as f:
            f.seek(257)
            return f.read(5) == b"ustar"
    except OSError:
        return False


# ------------------------------------------------------------ export
def variant_files(info: ResolvedVariant) -> list[tuple[str, Path]]:
    """(path in the bundle, file on disk) of an installed variant."""
    assert info.file is not None
    if info.format == "gguf":
        return [(p.name, p) for p in split_gguf.parts_of(info.file)]
    return [(f.relative.as_posix(), info.file / f.relative) for f in imp.tree_files(info.file)]


def build_manifest(info: ResolvedVariant, ctx: JobContext) -> tuple[JsonObject, list[tuple[str, Path]]]:
    """Hash the variant's files again; refuse unless they still match its recorded sha256."""
    files = variant_files(info)
    total = sum(p.stat().st_size for _, p in files)
    entries, done = [], 0
    for rel, path in files:
        size = path.stat().st_size
        entries.append((rel, size, imp.hash_file(path, ctx, done_before=done, total=total)))
        done += size
    digest = entries[0][2] if info.format == "gguf" and len(entries) == 1 else imp.tree_digest(entries)
    if info.sha256 is not None and digest != info.sha256:
        raise Conflict(
            f"the files of `{info.name}` no longer match its sha256; verify it before exporting",
            param="name",
            code="model_corrupt",
        )
    manifest: JsonObject = {
        "kind": KIND,
        "version": VERSION,
        "name": info.name,
        "family": info.family,
        "variant": info.variant,
        "format": info.format,
        "quantization": info.quantization,
        "source": info.source,
        "sha256": info.sha256,
        "size_bytes": total,
        "facts": {k: v for k, v in info.facts.items() if k != "chat_template"},
        "files": [{"path": rel, "size": size, "sha256": sha} for rel, size, sha in entries],
    }
    return manifest, files


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def bundle_stream(manifest: JsonObject, files: list[tuple[str, Path]]) -> Iterator[bytes]:
    """The bundle's bytes, file by file (never the whole model in memory)."""
    body = json.dumps(manifest, indent=1).encode()
    yield _member(MANIFEST, len(body)) + body + _padding(len(body))
    for rel, path in files:
        size = next(f["size"] for f in manifest["files"] if f["path"] == rel)
        yield _member(PREFIX + rel, size)
        sent = 0
        with path.open("rb") as f:
            while sent < size and (block := f.read(min(imp.CHUNK, size - sent))):
                sent += len(block)
                yield block
        if sent != size:
            raise RefusedImport(f"{rel} changed while it was exported")
        yield _padding(size)
    yield b"\0" * (2 * BLOCK)


# ------------------------------------------------------------ import
def _refuse(message: str) -> RefusedImport:
    return RefusedImport(f"the bundle is refused: {message}", param="path")


def parse_manifest(raw: bytes) -> Manifest:
    try:
        data = json.loads(raw)
    except ValueError:
        raise _refuse("its manifest.json is not JSON") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("version") != VERSION:
        raise _refuse(f"it is not a version {VERSION} {KIND}")
    fmt = data.get("format")
    if fmt not in ("gguf", "safetensors"):
        raise _refuse("its format is neither gguf nor safetensors")
    try:
        family, variant = check_part(data.get("family"), "family"), check_part(data.get("variant"), "variant")
    except BadRequest:
        raise _refuse("its model name is invalid") from None
    listed = data.get("files")
    if not isinstance(listed, list) or not listed or len(listed) > imp.MAX_FILES:
        raise _refuse("its manifest lists no files, or too many")
    files, seen = [], set()
    for entry in listed:
        if not isinstance(entry, dict):
            raise _refuse("a manifest entry is not an object")
        path = check_repo_path(entry.get("path"), "a manifest entry")
        size, sha = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or size < 0 or not isinstance(sha, str) or not _SHA256.fullmatch(sha) or path in seen:
            raise _refuse(f"the manifest entry {path} has no valid size and sha256, or comes twice")
        if fmt == "gguf" and ("/" in path or not path.lower().endswith(".gguf")):
            raise _refuse(f"{path} is not a GGUF file")
        why = imp.refusal(PurePosixPath(path)) if fmt == "safetensors" else None
        if why:
            raise _refuse(why)
        seen.add(path)
        files.append(BundleFile(path, size, sha))
    if fmt == "gguf" and len(files) > 1:
        expected = [p.name for p in split_gguf.parts_of(Path(files[0].path))]
        if [f.path for f in files] != expected:
            raise _refuse("its GGUF files are neither one file nor the parts of one split set, in order")
    source = data.get("source") if isinstance(data.get("source"), str) else None
    quant = data.get("quantization") if isinstance(data.get("quantization"), str) else None
    return Manifest(family, variant, fmt, tuple(files), source, quant)


def read_manifest(path: Path) -> Manifest:
    """The manifest of the bundle at ``path`` (its first member), checked."""
    with tarfile.open(path, "r:") as tar:
        first = tar.next()
        if first is None or first.name != MANIFEST or not first.isreg() or first.size > MAX_MANIFEST:
            raise _refuse("manifest.json is not its first member")
        stream = tar.extractfile(first)
        assert stream is not None
        return parse_manifest(stream.read())


def unpack_bundle(path: Path, into: Path, ctx: JobContext) -> tuple[Manifest, dict[str, str]]:
    """Extract and verify every file of the bundle into ``into`` (an empty folder): the manifest and each file's sha256."""
    manifest = read_manifest(path)
    expected = {f.path: f for f in manifest.files}
    digests: dict[str, str] = {}
    total, done = manifest.size_bytes, 0
    try:
        with tarfile.open(path, "r:") as tar:
            tar.next()  # the manifest, read above
            while (member := tar.next()) is not None:
                ctx.check_cancelled()
                if not member.isreg():
                    raise _refuse(f"{_shown(member.name)} is a link, a folder or a device, not a regular file")
                name = member.name
                if not name.startswith(PREFIX):
                    raise _refuse(f"{_shown(name)} is not a file of the manifest")
                rel = check_repo_path(name[len(PREFIX) :], "a member of the bundle")
                entry = expected.get(rel)
                if entry is None or rel in digests:
                    raise _refuse(f"{_shown(rel)} is not in the manifest, or comes twice")
                if member.size != entry.size:
                    raise _refuse(f"{rel} has {member.size} bytes; the manifest says {entry.size}")
                stream = tar.extractfile(member)
                assert stream is not None
                target = into / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                digests[rel] = _copy(stream, target, entry.size, ctx.within(done, total))
                done += entry.size
                if digests[rel] != entry.sha256:
                    raise ChecksumMismatch(f"the bundle's {rel} does not match its sha256 in the manifest")
    except tarfile.TarError:
        raise _refuse("it is not a readable tar file") from None
    missing = sorted(set(expected) - set(digests))
    if missing:
        raise _refuse(f"it lacks {', '.join(missing[:3])}")
    return manifest, digests


def _copy(stream: IO[bytes], target: Path, size: int, ctx: JobContext) -> str:
    digest, done = hashlib.sha256(), 0
    with target.open("xb") as out:
        while done < size and (block := stream.read(min(imp.CHUNK, size - done))):
            ctx.check_cancelled()
            out.write(block)
            digest.update(block)
            done += len(block)
            ctx.progress(done, size)
    if done != size:
        raise _refuse(f"{target.name} ends early")
    return digest.hexdigest()


def _shown(name: str) -> str:
    return repr(name) if name.isprintable() and len(name) < 200 else "a member"
