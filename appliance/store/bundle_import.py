"""Installing an offline bundle: unpack and verify it in the store's trash, then install its files along the one path.

The bundle's files are moved, not copied, out of the unpacked folder into the install's partial file or staging
folder (:class:`~appliance.store.installs.Installer`), so each digest checked while unpacking is the one recorded.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from appliance.store import bundles
from appliance.store.disk import check_free_space
from appliance.store.installs import Installer
from appliance.store.jobs import JobContext
from appliance.store.paths import StoreLayout
from appliance.store.variants import VariantInfo


def install_bundle(
    installer: Installer, layout: StoreLayout, source: Path, family: str, variant: str, ctx: JobContext
) -> VariantInfo:
    """Install the bundle at ``source`` as ``family:variant``; the unpacked folder is removed whatever happens."""
    manifest = bundles.read_manifest(source)
    check_free_space(layout.root, manifest.size_bytes)
    work = layout.trash_dir() / f"bundle-{uuid.uuid4().hex}"
    work.mkdir(mode=0o700)
    try:
        manifest, digests = bundles.unpack_bundle(source, work, ctx)

        def move(relative: str, target: Path) -> str:
            os.replace(layout.inside(work / relative), target)
            return digests[relative]

        origin = f"bundle:{manifest.source or manifest.name}"
        files = manifest.files
        if manifest.format == "safetensors":
            return installer.install_hf_files(
                family, variant, source=origin, ctx=ctx, files=[(f.path, f.size) for f in files], write=move
            )
        if len(files) == 1:
            return installer.install_gguf(
                family,
                variant,
                source=origin,
                ctx=ctx,
                expected_sha256=files[0].sha256,
                write=lambda partial: move(files[0].path, partial),
            )
        return installer.install_gguf_parts(
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
