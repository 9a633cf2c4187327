"""Installing variants into the store from files, along one path.

Claim the name, write into a partial file or a hidden staging folder, verify and
inspect it, fsync, rename it into place atomically, then mark the row ``ready``.
A failure removes what was written and the row, except a pull that can resume.
After a crash, installs that never finished are cleaned up at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from appliance.errors import ApplianceError, BadRequest, Conflict, InsufficientStorage
from appliance.jsontypes import JsonObject
from appliance.modelfacts import inspect_gguf, inspect_hf
from appliance.modelfacts.gguf_header import read_header
from appliance.store import imports as imp
from appliance.store import split_gguf
from appliance.store.disk import check_free_space, disk_full, fsync
from appliance.store.download import remove_partial
from appliance.store.errors import ChecksumMismatch
from appliance.store.jobs import JobContext
from appliance.store.paths import StoreLayout, full_name
from appliance.store.registry import VariantRegistry
from appliance.store.variants import VariantInfo

log = logging.getLogger("appliance.store.installs")

# Markers of the known Jinja sandbox escapes (CVE-2024-34359 and kin). Only a flag for
# admins: templates are never rendered here, and the renderer is sandboxed anyway.
_TEMPLATE_RED_FLAGS = (
    "__globals__",
    "__builtins__",
    "__class__",
    "__subclasses__",
    "__mro__",
    "__base__",
    "__init__",
    "__import__",
    "popen",
    "os.system",
    "subprocess",
    "eval(",
    "exec(",
)


class BusyNames:
    """The variants an operation (install, verify, delete) is working on; a second one on the same name is refused."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def claim(self, family: str, variant: str) -> Iterator[None]:
        name = full_name(family, variant)
        with self._lock:
            if name in self._busy:
                raise Conflict(f"`{name}` is busy with another operation", param="name", code="model_busy")
            self._busy.add(name)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(name)


class Installer:
    """``Installer(layout, registry, busy)``: writes variants under ``layout`` and records them in ``registry``."""

    def __init__(self, layout: StoreLayout, registry: VariantRegistry, busy: BusyNames):
        self.layout = layout
        self.registry = registry
        self.busy = busy

    def install_gguf(
        self,
        family: str,
        variant: str,
        *,
        source: str,
        ctx: JobContext,
        write: Callable[[Path], str | None],
        parent_id: int | None = None,
        expected_sha256: str | None = None,
        needed_bytes: int | None = None,
        resumable: Callable[[BaseException], bool] = lambda _exc: False,
    ) -> VariantInfo:
        """The one install path of a GGUF variant.

        ``write(partial)`` produces ``<file>.partial`` and returns its sha256 if it hashed it on the way (else it
        is hashed here). The file is then checked against ``expected_sha256``, inspected (the copy, not a source
        that could change after the check), fsynced and renamed into place; only then is the row ``ready``. On
        failure the partial file and the row go, unless ``resumable(exc)`` says to keep them for a later retry.
        """
        with self.busy.claim(family, variant):
            final, partial = self.layout.gguf_file(family, variant), self.layout.partial_file(family, variant)
            if split_gguf.SPLIT_RE.match(final.name):
                raise BadRequest(
                    f"`{full_name(family, variant)}` ends like a part of a split model (-00001-of-00002); "
                    "choose another variant name",
                    param="name",
                    code="invalid_model_name",
                )
            check_free_space(self.layout.root, needed_bytes)
            row_id = self._begin(family, variant, fmt="gguf", source=source, path=final, parent_id=parent_id)
            try:
                digest = write(partial)
                if digest is None:
                    ctx.stage("hashing")
                    digest = imp.hash_file(partial, ctx, total=partial.stat().st_size)
                if expected_sha256 and digest != expected_sha256:
                    raise ChecksumMismatch(f"sha256 mismatch: expected {expected_sha256}, got {digest}")
                ctx.stage("inspecting")
                facts = self.inspect(partial, "gguf")
                size = partial.stat().st_size
                fsync(partial)
                os.replace(partial, final)
                fsync(final.parent, directory=True)
            except BaseException as exc:
                if not (partial.exists() and resumable(exc)) or disk_full(exc):
                    remove_partial(partial)
                    self._abandon(row_id)
                if disk_full(exc):
                    raise _no_space() from None
                raise
            remove_partial(partial)  # a download's .json sidecar
            return self.registry.finish(row_id, size=size, sha256=digest, facts=facts)

    def import_gguf(self, source: Path, family: str, variant: str, ctx: JobContext) -> VariantInfo:
        """Copy a checked GGUF file into the store, hashing it on the way."""
        size = source.stat().st_size
        return self.install_gguf(
            family,
            variant,
            source=f"import:{source.name}",
            ctx=ctx,
            needed_bytes=size,
            write=lambda partial: imp.copy_file(source, partial, ctx, total=size)[0],
        )

    def import_hf(self, source: Path, family: str, variant: str, ctx: JobContext) -> VariantInfo:
        """Copy a Hugging Face safetensors folder into a staging folder, then rename it into place."""
        with self.busy.claim(family, variant):
            files = imp.scan_hf_folder(source)
            total = sum(f.size for f in files)
            check_free_space(self.layout.root, total)
            done = 0

            def copy(relative: str, target: Path) -> tuple[str, int]:
                nonlocal done
                digest, size = imp.copy_file(source / relative, target, ctx, done_before=done, total=total)
                done += size
                return digest, size

            return self._install_folder(
                family,
                variant,
                source=f"import:{source.name}",
                ctx=ctx,
                relatives=[f.relative.as_posix() for f in files],
                fill=copy,
                scan_staged=False,
            )

    def install_gguf_parts(
        self,
        family: str,
        variant: str,
        *,
        source: str,
        ctx: JobContext,
        count: int,
        write: Callable[[int, Path], str],
        resumable: Callable[[BaseException], bool],
    ) -> VariantInfo:
        """A split GGUF model: ``write(number, partial)`` fills each part's partial file and returns its sha256; then
        every part is inspected, fsynced and renamed into place, and only then is the row ``ready``. On failure the
        partial files and the row go, unless ``resumable(exc)`` keeps them for a later pull to resume."""
        with self.busy.claim(family, variant):
            finals = self.layout.gguf_parts(family, variant, count)
            partials = [final.with_name(final.name + ".partial") for final in finals]
            row_id = self._begin(family, variant, fmt="gguf", source=source, path=finals[0])
            try:
                digests = [write(number, partial) for number, partial in enumerate(partials, start=1)]
                entries = [
                    (final.name, partial.stat().st_size, digest)
                    for final, partial, digest in zip(finals, partials, digests, strict=True)
                ]
                ctx.stage("inspecting")
                facts = self.inspect_parts(partials)
                for final, partial in zip(finals, partials, strict=True):
                    fsync(partial)
                    os.replace(partial, final)
                fsync(finals[0].parent, directory=True)
            except BaseException as exc:
                if not resumable(exc) or disk_full(exc):
                    for partial in partials:
                        remove_partial(partial)
                    self._abandon(row_id)
                if disk_full(exc):
                    raise _no_space() from None
                raise
            for partial in partials:
                remove_partial(partial)  # the downloads' .json sidecars
            return self.registry.finish(
                row_id, size=sum(size for _, size, _ in entries), sha256=imp.tree_digest(entries), facts=facts
            )

    def install_hf_files(
        self,
        family: str,
        variant: str,
        *,
        source: str,
        ctx: JobContext,
        files: Sequence[tuple[str, int]],
        write: Callable[[str, Path], str],
    ) -> VariantInfo:
        """A safetensors folder fetched file by file: ``write(relative, target)`` fills each file in a hidden staging
        folder and returns its sha256; the folder then passes the import policy (no code, no pickles, no ``auto_map``)
        and inspection before its atomic rename into place."""
        with self.busy.claim(family, variant):
            check_free_space(self.layout.root, sum(size for _, size in files))
            return self._install_folder(
                family,
                variant,
                source=source,
                ctx=ctx,
                relatives=[relative for relative, _ in files],
                fill=lambda relative, target: (write(relative, target), target.stat().st_size),
                scan_staged=True,
            )

    def _install_folder(
        self,
        family: str,
        variant: str,
        *,
        source: str,
        ctx: JobContext,
        relatives: Sequence[str],
        fill: Callable[[str, Path], tuple[str, int]],
        scan_staged: bool,
    ) -> VariantInfo:
        """Fill a hidden staging folder file by file (``fill`` returns each file's sha256 and size), check it
        (the import policy again when ``scan_staged``), inspect it and rename it into place; on any failure the
        staging folder and the row go. The caller holds the variant's claim."""
        final = self.layout.variant_dir(family, variant)
        staging = self.layout.staging_dir(family, variant)
        row_id = self._begin(family, variant, fmt="safetensors", source=source, path=final)
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o750)
            entries = []
            for relative in relatives:
                target = self.layout.inside(staging / relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                digest, size = fill(relative, target)
                entries.append((relative, size, digest))
            if scan_staged:
                imp.scan_hf_folder(staging)
            ctx.stage("inspecting")
            facts = self.inspect(staging, "safetensors")
            self._commit_dir(staging, final)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            self._abandon(row_id)
            if disk_full(exc):
                raise _no_space() from None
            raise
        return self.registry.finish(
            row_id, size=sum(size for _, size, _ in entries), sha256=imp.tree_digest(entries), facts=facts
        )

    def move_to_trash(self, path: Path) -> Path:
        """Rename ``path`` into the store's trash folder (atomic); where it went."""
        trash = self.layout.trash_dir() / uuid.uuid4().hex
        os.rename(path, trash)
        return trash

    def forget_unfinished(self) -> None:
        """After a crash: drop rows of imports, quantizations and package installs that never finished.

        Unfinished pulls stay (``downloading``): pulling the same name again resumes their partial file.
        """
        for row, fam in self.registry.unfinished():
            if (row.source or "").startswith(("http://", "https://", "hf:")):
                continue
            log.warning("removing the unfinished install of %s", full_name(fam.name, row.name))
            with contextlib.suppress(ApplianceError, OSError):
                remove_partial(self.layout.partial_file(fam.name, row.name))
                shutil.rmtree(self.layout.staging_dir(fam.name, row.name), ignore_errors=True)
            assert row.id is not None  # read from the database
            self._abandon(row.id)

    def empty_trash(self) -> None:
        trash = self.layout.root / ".trash"
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)

    # ------------------------------------------------------------ steps
    def _begin(self, family: str, variant: str, *, fmt: str, source: str, path: Path, parent_id: int | None = None) -> int:
        """Create (or take over) the variant's row in state ``downloading``; make its folder."""
        self.registry.refuse_installed(family, variant)
        self.layout.family_dir(family).mkdir(exist_ok=True, mode=0o750)
        self.layout.variant_dir(family, variant).mkdir(exist_ok=True, mode=0o750)
        return self.registry.begin(family, variant, fmt=fmt, source=source, path=self.layout.relative(path), parent_id=parent_id)

    def _abandon(self, row_id: int) -> None:
        """Drop an install's row (and its family, if that was all it had); a ready file left behind is kept."""
        names = self.registry.drop(row_id)
        if names is not None:
            with contextlib.suppress(ApplianceError, OSError):  # only empty folders go
                self.layout.variant_dir(*names).rmdir()
                self.layout.family_dir(names[0]).rmdir()

    def _commit_dir(self, staging: Path, final: Path) -> None:
        for dirpath, _dirs, files in os.walk(staging):
            for name in files:
                fsync(Path(dirpath) / name)
        if final.exists():  # an earlier, corrupt copy: move it aside atomically, then drop it
            shutil.rmtree(self.move_to_trash(final), ignore_errors=True)
        os.rename(staging, final)
        fsync(final.parent, directory=True)

    @classmethod
    def inspect_parts(cls, parts: list[Path]) -> JsonObject:
        """Facts of a split model: the first part's metadata, with the tensors of every part (each header checked)."""
        out = cls.inspect(parts[0], "gguf")
        tensors = [t for part in parts[1:] for t in read_header(part).tensors]
        out["tensor_bytes"] = (out.get("tensor_bytes") or 0) + sum(t.n_bytes for t in tensors)
        out["nonlayer_bytes"] = (out.get("nonlayer_bytes") or 0) + sum(
            t.n_bytes for t in tensors if not t.name.startswith("blk.")
        )
        out["parameter_count"] = (out.get("parameter_count") or 0) + sum(t.n_elements for t in tensors)
        if any(t.name == "output.weight" for t in tensors):
            out["tied_embeddings"] = False
        return out

    @staticmethod
    def inspect(path: Path, fmt: str) -> JsonObject:
        facts = inspect_gguf(path) if fmt == "gguf" else inspect_hf(path)
        out = facts.to_dict()
        template = facts.chat_template or ""
        out["chat_template_flags"] = sorted({m for m in _TEMPLATE_RED_FLAGS if m in template})
        return out


def _no_space() -> InsufficientStorage:
    return InsufficientStorage("the model store's disk is full; the unfinished copy was removed. Free some space and retry.")
