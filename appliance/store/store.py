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
in :mod:`appliance.store.imports`, the quantizer in :mod:`appliance.store.quantize`;
what a pull or an import names is read by :mod:`appliance.store.sources`, bundles
are installed by :mod:`appliance.store.bundle_import`, and the refusals of a
read-only store or an offline appliance are :mod:`appliance.store.refusals`.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import Engine

from appliance.catalog import Catalog, load_catalog
from appliance.errors import BadRequest, Conflict, ModelNotFound
from appliance.jsontypes import JsonObject
from appliance.settings import Settings
from appliance.store import bundles, readonly, refusals
from appliance.store import quantize as quantizer
from appliance.store.bundle_import import install_bundle
from appliance.store.download import Downloader
from appliance.store.errors import ModelCorrupt, ModelNotReady
from appliance.store.hub.client import HubClient
from appliance.store.hub.credentials import HubCredentials
from appliance.store.hub.pulls import Chooser, HubPull, offers_of, plan_pull, run_pull
from appliance.store.hub.spec import is_hub_spec, parse_spec
from appliance.store.installs import BusyNames, Installer
from appliance.store.integrity import digest_on_disk, size_on_disk
from appliance.store.jobs import JobContext, NullContext
from appliance.store.paths import StoreLayout, parse_name
from appliance.store.pull import check_url
from appliance.store.registry import VariantRegistry
from appliance.store.sources import import_source, pull_source
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

    def family_names(self) -> builtins.list[str]:
        """Every family the appliance knows: those in the catalog and those installed (imports may add others)."""
        return sorted({*self.catalog.families, *(v.family for v in self.list())})

    def get(self, name: str) -> VariantInfo:
        """The variant ``family:variant`` (or the family's default), whatever its status."""
        return self.registry.get(name)

    def resolve(self, name: str) -> ResolvedVariant:
        """The installed, ready variant a name means; raises for missing, unfinished or corrupt ones."""
        info = self.get(name)
        refusals.check_downloaded(info)
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
        url, sha256, family, variant = pull_source(self.catalog, url, sha256=sha256, name=name)
        check_url(url, self.settings.allow_private_pull_hosts)
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
        refusals.check_scannable(self.read_only)

    def _refuse_writes(self, param: str = "name") -> None:
        refusals.refuse_writes(self.read_only, param)

    def _refuse_offline(self) -> None:
        refusals.refuse_offline(self.settings.offline)

    def prepare_import(self, path: str, name: str | None = None) -> tuple[Path, str, str, str]:
        """Check an import before it becomes a job: (source, format, family, variant)."""
        self._refuse_writes("path")
        source, fmt, family, variant = import_source(path, name, store_root=self.layout.root)
        self.registry.refuse_installed(family, variant)
        return source, fmt, family, variant

    def import_path(self, path: str, *, name: str | None = None, ctx: JobContext | None = None) -> VariantInfo:
        """Copy a local GGUF file or HF safetensors folder into the store (inspected, hashed, atomic)."""
        ctx = ctx or NullContext()
        source, fmt, family, variant = self.prepare_import(path, name)
        if fmt == "bundle":
            return install_bundle(self.installer, self.layout, source, family, variant, ctx)
        if fmt == "gguf":
            return self.installer.import_gguf(source, family, variant, ctx)
        return self.installer.import_hf(source, family, variant, ctx)

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
        refusals.check_downloaded(info)
        with self._busy.claim(info.family, info.variant):
            path = self.layout.absolute(info.path)
            ctx.stage("hashing")
            digest: str | None
            try:
                digest, size = digest_on_disk(path, info.format, ctx, expected_size=info.size_bytes)
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
        refusals.check_downloaded(info)
        self.registry.set_default(family, info.variant)
        return self.get(name)


def _size_on_disk(path: Path, fmt: str) -> int:
    try:
        return size_on_disk(path, fmt)
    except OSError:
        return -1


__all__ = ["ModelStore", "VariantInfo", "ResolvedVariant", "ModelCorrupt", "ModelNotReady"]
