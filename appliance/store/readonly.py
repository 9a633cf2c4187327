"""A read-only model store (``store_read_only = true``): the models an admin keeps there are registered, never written.

The store folder may then be a read-only mount that admins fill themselves. At start (and on
``POST /admin/models/scan``) it is searched, symlinks and hidden entries skipped:

* ``<file>.gguf`` at the top → ``family:variant`` from the file name (``Llama-3.2-1B-Q4_K_M.gguf``
  → ``llama-3.2-1b:q4_k_m``); a split set counts once, by its first part;
* ``<folder>/`` holding ``config.json`` → a safetensors variant (the import policy applies: code,
  pickles and ``auto_map`` are refused);
* ``<folder>/<file>.gguf`` → family from the folder, variant from the file's quantization;
* ``<family>/<variant>/`` holding one GGUF file (or split set) or a safetensors folder: the
  store's own layout.

Each new or changed variant is hashed and inspected (the database, in the data dir, keeps what
was found); a variant whose files are gone is forgotten (one listed on the hub as ``available`` never
had files here and stays as it is). Nothing is created, renamed or deleted
in the folder: pulls, imports, quantizations and deletes are refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import ApplianceError, BadRequest
from appliance.modelfacts.errors import InvalidModelFile
from appliance.store import imports as imp
from appliance.store import split_gguf
from appliance.store.hub.listing import quant_of
from appliance.store.installs import Installer
from appliance.store.integrity import size_on_disk
from appliance.store.jobs import JobContext
from appliance.store.paths import StoreLayout, check_part, names_from_filename, slug
from appliance.store.registry import VariantRegistry
from appliance.store.variants import VariantInfo

log = logging.getLogger("appliance.store.readonly")
SOURCE = "read-only store"


@dataclass(frozen=True)
class Found:
    family: str
    variant: str
    format: str  # gguf | safetensors
    path: Path  # the GGUF file (first part) or the HF folder


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        return sorted((e for e in it if not e.name.startswith(".") and not e.is_symlink()), key=lambda e: e.name)


def _is_model_gguf(entry: os.DirEntry[str]) -> bool:
    name = entry.name.lower()
    if not entry.is_file(follow_symlinks=False) or not name.endswith(".gguf") or name.startswith("mmproj"):
        return False
    match = split_gguf.SPLIT_RE.match(entry.name)
    return match is None or int(match.group("no")) == 1  # later parts come with their first


def _gguf_stem(name: str) -> str:
    match = split_gguf.SPLIT_RE.match(name)
    return match.group("prefix") if match else name[:-5]


def find_models(root: Path) -> list[Found]:
    """What the folder holds, by the rules above (names that are not valid model names are skipped)."""
    found: list[Found] = []

    def add(family: str, variant: str, fmt: str, path: Path) -> None:
        try:
            found.append(Found(check_part(family, "family"), check_part(variant, "variant"), fmt, path))
        except BadRequest:
            log.warning("skipping %s in the read-only store: no valid model name", path.name)

    for entry in _entries(root):
        path = Path(entry.path)
        if _is_model_gguf(entry):
            add(*names_from_filename(_gguf_stem(entry.name) + ".gguf"), "gguf", path)
        elif entry.is_dir(follow_symlinks=False):
            if (path / "config.json").is_file():
                add(slug(entry.name), imp.guess_hf_variant(path), "safetensors", path)
                continue
            for inner in _entries(path):
                inner_path = Path(inner.path)
                if _is_model_gguf(inner):
                    quant = quant_of(_gguf_stem(inner.name) + ".gguf")
                    add(slug(entry.name), quant.lower() if quant else slug(_gguf_stem(inner.name)), "gguf", inner_path)
                elif inner.is_dir(follow_symlinks=False):
                    if (inner_path / "config.json").is_file():
                        add(entry.name, inner.name, "safetensors", inner_path)
                        continue
                    ggufs = [e for e in _entries(inner_path) if _is_model_gguf(e)]
                    if len(ggufs) == 1:
                        add(entry.name, inner.name, "gguf", Path(ggufs[0].path))
    seen: set[tuple[str, str]] = set()
    unique = []
    for f in found:
        if (f.family, f.variant) in seen:
            log.warning("skipping %s in the read-only store: %s:%s is already taken", f.path.name, f.family, f.variant)
            continue
        seen.add((f.family, f.variant))
        unique.append(f)
    return unique


def register_found(layout: StoreLayout, registry: VariantRegistry, ctx: JobContext) -> list[VariantInfo]:
    """Register new or changed models of the folder, forget those whose files are gone; the variants registered now."""
    known = {(i.family, i.variant): i for i in registry.list()}
    registered = []
    found = find_models(layout.root)
    for f in found:
        relative = layout.relative(f.path)
        size = size_on_disk(f.path, f.format)
        old = known.get((f.family, f.variant))
        if old is not None and old.path == relative and old.size_bytes == size and old.status == "ready":
            continue
        try:
            registered.append(_register(f, relative, registry, ctx))
        except (ApplianceError, InvalidModelFile, OSError) as exc:
            log.warning("skipping %s in the read-only store: %s", relative, getattr(exc, "message", None) or exc)
    present = {(f.family, f.variant) for f in found}
    for key, info in known.items():
        if key not in present and not info.available:  # available variants never had files here
            log.info("forgetting %s: its files are no longer in the read-only store", info.name)
            registry.remove(info)
    return registered


def _register(f: Found, relative: str, registry: VariantRegistry, ctx: JobContext) -> VariantInfo:
    ctx.stage(f"hashing {relative}")
    if f.format == "gguf" and split_gguf.is_split(f.path):
        digest, size = split_gguf.hash_parts(f.path, ctx)
        facts = Installer.inspect_parts(split_gguf.parts_of(f.path))
    elif f.format == "gguf":
        size = f.path.stat().st_size
        digest, facts = imp.hash_file(f.path, ctx, total=size), Installer.inspect(f.path, "gguf")
    else:
        imp.scan_hf_folder(f.path)
        digest, size = imp.hash_tree(f.path, ctx)
        facts = Installer.inspect(f.path, "safetensors")
    row_id = registry.begin(f.family, f.variant, fmt=f.format, source=SOURCE, path=relative)
    return registry.finish(row_id, size=size, sha256=digest, facts=facts)
