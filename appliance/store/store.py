"""The model store: installed variants on disk, their rows in the database.

Variants live side by side as ``family:variant`` (``gemma-3-270m:q4_k_m``) under
``<store>/<family>/<variant>/``; each family has a default variant, so
``resolve("gemma-3-270m")`` gives that one. Installs (pull, import, package,
quantize) all follow one path (:mod:`appliance.store.installs`): claim the name,
write into a partial file or a hidden staging folder, verify and inspect it,
fsync, rename it into place atomically, then mark the row ``ready``. ``resolve``
never returns a variant that is not ``ready`` or whose file size changed, so
corrupt models are never loaded.

:class:`ModelStore` checks requests before they become jobs and runs them: pulls,
imports, quantizations, verification, deletes and the default variant. Long
operations take a :class:`~appliance.store.jobs.JobContext` for progress and
cancel; without one they run silently. The rows live in
:mod:`appliance.store.registry`, downloads in :mod:`appliance.store.download`
(behind the SSRF checks of :mod:`appliance.store.pull`), file policy and hashing
in :mod:`appliance.store.imports`, the quantizer in :mod:`appliance.store.quantize`.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import Engine

from appliance.catalog import Catalog, load_catalog
from appliance.errors import BadRequest, Conflict, ModelNotFound
from appliance.jsontypes import JsonObject
from appliance.settings import Settings
from appliance.store import bundles, readonly, split_gguf
from appliance.store import imports as imp
from appliance.store import quantize as quantizer
from appliance.store.disk import check_free_space
from appliance.store.download import Downloader
from appliance.store.errors import ModelCorrupt, ModelNotDownloaded, ModelNotReady, Offline, RefusedImport, StoreReadOnly
from appliance.store.hub.client import HubClient
from appliance.store.hub.credentials import HubCredentials
from appliance.store.hub.pulls import Chooser, HubPull, offers_of, plan_pull, run_pull
from appliance.store.hub.spec import is_hub_spec, parse_spec
from appliance.store.installs import BusyNames, Installer
from appliance.store.jobs import JobContext, NullContext
from appliance.store.paths import StoreLayout, parse_name
from appliance.store.paths import names_from_filename as _names_from_filename
from appliance.store.paths import slug as _slug
from appliance.store.pull import check_url
from appliance.store.registry import VariantRegistry
from appliance.store.variants import ResolvedVariant, VariantInfo

log = logging.getLogger("appliance.store.store")


class ModelStore:
    """``ModelStore(settings, db_engine, is_loaded=...)``; ``is_loaded(name) -> bool`` guards deletes."""

    def __init__(
        self,
        settings: Settings,
        db_engine: Engine,
        *,
        is_loaded: Callable[[str], bool] | None = None,
        catalog: Catalog | None = None,
        choose: Chooser | None = None,
    ):
        self.settings = settings
        self.choose = choose
        self.db = db_engine
        self.read_only = settings.store_read_only
        self.layout = StoreLayout(settings.store_dir, create=not self.read_only)
        self.is_loaded = is_loaded or (lambda _name: False)
        self._catalog = catalog
        self.registry = VariantRegistry(db_engine, lambda: self.catalog)
        self._busy = BusyNames()
        self.installer = Installer(self.layout, self.registry, self._busy)
        if not self.read_only:
            self.installer.empty_trash()
            self.installer.forget_unfinished()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    # ------------------------------------------------------------ queries
    def list(self) -> list[VariantInfo]:
        return self.registry.list()

    def get(self, name: str) -> VariantInfo:
        """The variant ``family:variant`` (or the family's default), whatever its status."""
        return self.registry.get(name)

    def resolve(self, name: str) -> ResolvedVariant:
        """The installed, ready variant a name means; raises for missing, unfinished or corrupt ones."""
        info = self.get(name)
        self.check_downloaded(info)
        if info.status == "downloading":
            raise ModelNotReady(f"The model `{info.name}` is still being installed.", param="model")
        if info.status != "ready":
            raise ModelCorrupt(
                f"The model `{info.name}` failed verification and will not be loaded; reinstall it or delete it.", param="model"
            )
        path = self.layout.absolute(info.path)
        if _size_on_disk(path, info.format) != info.size_bytes:
            self.registry.set_status(info.id, "corrupt")
            raise ModelCorrupt(
                f"The files of `{info.name}` changed on disk; it is marked corrupt and will not be loaded.", param="model"
            )
        return ResolvedVariant(**asdict(info), file=path)

    # ------------------------------------------------------------ installs
    def prepare_pull(
        self, url: str | None = None, *, sha256: str | None = None, name: str | None = None
    ) -> tuple[str, str | None, str, str]:
        """Check a pull before it becomes a job: (url, sha256, family, variant). Raises 4xx errors."""
        self._refuse_writes("url")
        self._refuse_offline()
        if is_hub_spec(url):
            raise BadRequest("a hub pull (hf:ORG/REPO) is prepared with prepare_hub_pull", param="url", code="invalid_url")
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
        check_url(url, self.settings.allow_private_pull_hosts)
        assert family is not None and variant is not None
        self.registry.refuse_installed(family, variant)
        return url, sha256.lower() if sha256 else None, family, variant

    def pull(
        self, url: str | None = None, *, sha256: str | None = None, name: str | None = None, ctx: JobContext | None = None
    ) -> VariantInfo:
        """Download a GGUF file by URL (or a catalog name) into the store; resumes an earlier partial pull."""
        ctx = ctx or NullContext()
        url, sha256, family, variant = self.prepare_pull(url, sha256=sha256, name=name)  # refuses when offline
        allow = self.settings.allow_private_pull_hosts

        def download(partial: Path) -> str:
            return Downloader(url, partial, allow=allow, ctx=ctx, expected_sha256=sha256).run().sha256

        # A cancelled or dropped pull keeps its partial file and row, so pulling again resumes.
        return self.installer.install_gguf(
            family, variant, source=url, ctx=ctx, write=download, resumable=lambda exc: not isinstance(exc, BadRequest)
        )  # bad bytes are never kept

    def hub(self) -> HubClient:
        """A client of the configured hub, with the token as it is in its file now."""
        settings = self.settings
        return HubClient(
            settings.hub_url,
            allow=settings.allow_private_pull_hosts,
            credentials=HubCredentials.from_file(settings.hub_url, settings.hub_token_file),
        )

    def prepare_hub_pull(self, spec: str, *, name: str | None = None) -> HubPull:
        """List a hub repository and decide what ``hf:ORG/REPO[:QUANT|/FILE]`` pulls; raises 4xx errors."""
        self._refuse_writes("url")
        self._refuse_offline()
        parsed = parse_spec(spec)
        client = self.hub()
        check_url(client.base, self.settings.allow_private_pull_hosts)
        pull = plan_pull(client, parsed, name=name, choose=self.choose)
        self.registry.refuse_installed(pull.family, pull.variant)
        return pull

    def prepare_requested_pull(self, url: str | None, name: str | None, *, sha256: str | None = None) -> HubPull | None:
        """The hub pull a pull request means: a hub spec, or the name of an ``available`` variant (pulled from the
        source it was listed with); None for a URL or catalog pull. A hub pull takes no ``sha256``: the listing's."""
        if is_hub_spec(url):
            spec, install_as = url, name
        else:
            info = self._available(name) if url is None and name is not None else None
            if info is None or not is_hub_spec(info.source):
                return None
            spec, install_as = info.source, info.name
        if sha256 is not None:
            raise BadRequest("a hub pull takes each file's sha256 from the hub's listing", param="sha256")
        return self.prepare_hub_pull(spec, name=install_as)

    def _available(self, name: str) -> VariantInfo | None:
        try:
            info = self.get(name)
        except ModelNotFound:
            return None
        return info if info.available else None

    def pull_hub(self, pull: HubPull, *, ctx: JobContext | None = None) -> VariantInfo:
        """Download what :meth:`prepare_hub_pull` chose; an interrupted pull resumes when pulled again.

        The repository's other GGUF variants are registered ``available`` first; a pull that fails for good
        leaves its variant ``available`` too."""
        self._refuse_writes("url")
        self._refuse_offline()
        self.registry.offer(pull.family, offers_of(pull))
        try:
            return run_pull(pull, self.hub(), self.installer, ctx or NullContext())
        except BaseException:
            if pull.format == "gguf":
                self.registry.offer(pull.family, [o for o in offers_of(pull, with_pulled=True) if o.variant == pull.variant])
            raise

    def register_found(self, *, ctx: JobContext | None = None) -> builtins.list[VariantInfo]:
        """Read-only store: register the models found in its folder (new or changed ones are hashed)."""
        self.check_scannable()
        return readonly.register_found(self.layout, self.registry, ctx or NullContext())

    def check_scannable(self) -> None:
        if not self.read_only:
            raise Conflict(
                "only a read-only store (setting store_read_only = true) is scanned; install models by pull or import",
                code="store_writable",
            )

    def _refuse_writes(self, param: str = "name") -> None:
        if self.read_only:
            raise StoreReadOnly(
                "the model store is read-only (setting store_read_only = true): the appliance never writes "
                "there; add or remove model files in the folder itself, then rescan",
                param=param,
            )

    @staticmethod
    def check_downloaded(info: VariantInfo) -> None:
        """ModelNotDownloaded for a variant only listed on the hub (``available``): it has no files yet."""
        if info.available:
            raise ModelNotDownloaded(
                f"The model `{info.name}` is available on the hub but not downloaded; pull it first "
                f"(appliancectl models pull {info.name}).",
                param="model",
            )

    def _refuse_offline(self) -> None:
        if self.settings.offline:
            raise Offline(
                "the appliance is offline (setting offline = true): it makes no outbound request, so models "
                "cannot be pulled; import a file, a folder or an offline bundle instead",
                param="url",
            )

    def prepare_import(self, path: str, name: str | None = None) -> tuple[Path, str, str, str]:
        """Check an import before it becomes a job: (source, format, family, variant)."""
        self._refuse_writes("path")
        source = imp.check_source_path(path)
        if source.resolve().is_relative_to(self.layout.root):
            raise BadRequest("that path is already inside the model store", param="path", code="invalid_path")
        if source.is_file() and bundles.is_bundle(source):
            manifest = bundles.read_manifest(source)
            family, variant = parse_name(name) if name is not None else (manifest.family, manifest.variant)
            family, variant = family or manifest.family, variant or manifest.variant
            self.registry.refuse_installed(family, variant)
            return source, "bundle", family, variant
        fmt = "safetensors" if source.is_dir() else "gguf"
        if fmt == "safetensors":
            imp.scan_hf_folder(source)  # refuse code, pickles and remote code now, not in the job
        else:
            with open(source, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise RefusedImport("only GGUF files or Hugging Face safetensors folders can be imported", param="path")
        given_family, given_variant = parse_name(name) if name is not None else (None, None)
        if given_family is not None and given_variant is not None:
            guessed = (given_family, given_variant)
        elif fmt == "gguf":
            guessed = _names_from_filename(source.name)
        else:
            guessed = (_slug(source.name), imp.guess_hf_variant(source))
        family, variant = given_family or guessed[0], given_variant or guessed[1]
        self.registry.refuse_installed(family, variant)
        return source, fmt, family, variant

    def import_path(self, path: str, *, name: str | None = None, ctx: JobContext | None = None) -> VariantInfo:
        """Copy a local GGUF file or HF safetensors folder into the store (inspected, hashed, atomic)."""
        ctx = ctx or NullContext()
        source, fmt, family, variant = self.prepare_import(path, name)
        if fmt == "bundle":
            return self._import_bundle(source, family, variant, ctx)
        if fmt == "gguf":
            return self.installer.import_gguf(source, family, variant, ctx)
        return self.installer.import_hf(source, family, variant, ctx)

    def _import_bundle(self, source: Path, family: str, variant: str, ctx: JobContext) -> VariantInfo:
        """Unpack and verify an offline bundle in the store's trash, then install its files along the one path."""
        manifest = bundles.read_manifest(source)
        check_free_space(self.layout.root, manifest.size_bytes)
        work = self.layout.trash_dir() / f"bundle-{uuid.uuid4().hex}"
        work.mkdir(mode=0o700)
        try:
            manifest, digests = bundles.unpack_bundle(source, work, ctx)

            def move(relative: str, target: Path) -> str:
                os.replace(self.layout.inside(work / relative), target)
                return digests[relative]

            origin = f"bundle:{manifest.source or manifest.name}"
            files = manifest.files
            if manifest.format == "safetensors":
                return self.installer.install_hf_files(
                    family, variant, source=origin, ctx=ctx, files=[(f.path, f.size) for f in files], write=move
                )
            if len(files) == 1:
                return self.installer.install_gguf(
                    family,
                    variant,
                    source=origin,
                    ctx=ctx,
                    expected_sha256=files[0].sha256,
                    write=lambda partial: move(files[0].path, partial),
                )
            return self.installer.install_gguf_parts(
                family,
                variant,
                source=origin,
                ctx=ctx,
                count=len(files),
                write=lambda number, partial: move(files[number - 1].path, partial),
                resumable=lambda _exc: False,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def export_bundle(self, name: str, *, ctx: JobContext | None = None) -> tuple[JsonObject, builtins.list[tuple[str, Path]]]:
        """An installed variant's bundle manifest and files, after hashing them again (refused if they changed)."""
        info = self.resolve(name)
        with self._busy.claim(info.family, info.variant):
            return bundles.build_manifest(info, ctx or NullContext())

    def prepare_quantize(self, name: str, to: str) -> tuple[ResolvedVariant, str]:
        """Check a quantization before it becomes a job: (source variant, target variant name)."""
        self._refuse_writes()
        source = self.resolve(name)
        target = quantizer.check_request(source, to)
        self.registry.refuse_installed(source.family, target)
        return source, target

    def quantize(self, name: str, to: str, *, ctx: JobContext | None = None) -> VariantInfo:
        """Make a lower-bit GGUF variant of ``name`` with libllama's quantizer (child process)."""
        ctx = ctx or NullContext()
        source, target = self.prepare_quantize(name, to)
        threads = self.settings.engine_threads or max(1, os.cpu_count() or 1)
        return self.installer.install_gguf(
            source.family,
            target,
            source=f"quantize:{source.name}",
            ctx=ctx,
            write=quantizer.quantized_writer(source, target, threads=threads, ctx=ctx),
            parent_id=source.id,
            needed_bytes=source.size_bytes,
        )

    # ------------------------------------------------------------ maintenance
    def verify(self, name: str, *, ctx: JobContext | None = None) -> VariantInfo:
        """Hash the files again; a mismatch marks the variant corrupt, a match (re)marks it ready."""
        ctx = ctx or NullContext()
        info = self.get(name)
        self.check_downloaded(info)
        with self._busy.claim(info.family, info.variant):
            path = self.layout.absolute(info.path)
            ctx.stage("hashing")
            try:
                if info.format == "gguf" and split_gguf.is_split(path):
                    digest, size = split_gguf.hash_parts(path, ctx)
                elif info.format == "gguf":
                    digest, size = imp.hash_file(path, ctx, total=info.size_bytes), path.stat().st_size
                else:
                    digest, size = imp.hash_tree(path, ctx)
            except FileNotFoundError:
                digest, size = None, -1
            ok = digest is not None and size == info.size_bytes and (info.sha256 is None or digest == info.sha256)
            self.registry.set_status(info.id, "ready" if ok else "corrupt", sha256=digest if ok else None)
            if not ok:
                log.warning("model %s failed verification", info.name)
            return self.get(info.name)

    def delete(self, name: str) -> None:
        """Remove a variant's files and row. Refused (Conflict) while it is loaded or busy."""
        self._refuse_writes()
        family, variant = parse_name(name)
        if variant is None:
            raise BadRequest("name the variant to delete: family:variant", param="name", code="invalid_model_name")
        info = self.get(name)
        if self.is_loaded(info.name) or (info.is_default and self.is_loaded(family)):
            raise Conflict(f"`{info.name}` is loaded; unload it first", param="name", code="model_loaded")
        with self._busy.claim(family, variant):
            vdir = self.layout.variant_dir(family, variant)
            trash = self.installer.move_to_trash(vdir) if vdir.exists() else None
            try:
                self.registry.remove(info)
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
        self.check_downloaded(info)
        self.registry.set_default(family, info.variant)
        return self.get(name)


def _size_on_disk(path: Path, fmt: str) -> int:
    try:
        if fmt == "gguf":
            return split_gguf.size_of(path)
        return sum(f.size for f in imp.tree_files(path))
    except OSError:
        return -1


__all__ = ["ModelStore", "VariantInfo", "ResolvedVariant", "ModelCorrupt", "ModelNotReady"]
