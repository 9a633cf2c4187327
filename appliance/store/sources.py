"""What a pull or an import names before it becomes a job.

A pull gives a URL, a catalog name or both: :func:`pull_source` finds the URL and sha256 a catalog name stands for,
and the ``family:variant`` a URL installs as (the catalog's names for a known URL, else a guess from its file name).
An import gives a local path: :func:`import_source` tells a GGUF file, a Hugging Face safetensors folder and an
offline bundle apart, refuses what may not be imported, and names the variant it installs as.
"""

from __future__ import annotations

import re
from pathlib import Path

from appliance.catalog import Catalog
from appliance.errors import BadRequest, ModelNotFound
from appliance.store import bundles
from appliance.store import imports as imp
from appliance.store.errors import RefusedImport
from appliance.store.hub.spec import is_hub_spec
from appliance.store.paths import names_from_filename, parse_name, slug


def pull_source(catalog: Catalog, url: str | None, *, sha256: str | None, name: str | None) -> tuple[str, str | None, str, str]:
    """(url, sha256, family, variant) of a pull by URL or catalog name; the sha256 as given or as the catalog lists it."""
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
        entry = catalog.variant(family, variant)
        if entry is None:
            raise ModelNotFound(f"`{name}` is not in the catalog; give its url", param="name")
        if entry.url is None or entry.format != "gguf":
            raise BadRequest(f"`{name}` is not a single-file download; import it from a local folder instead", param="name")
        url, sha256, variant = str(entry.url), sha256 or entry.sha256, entry.name
    else:
        known = catalog.by_url(url)
        if known is not None:
            family, variant = family or known[0].name, variant or known[1].name
            sha256 = sha256 or known[1].sha256
        elif family is None or variant is None:
            guessed_family, guessed_variant = names_from_filename(url.split("?", 1)[0].rsplit("/", 1)[-1])
            family, variant = family or guessed_family, variant or guessed_variant
    assert family is not None and variant is not None
    return url, sha256, family, variant


def import_source(path: str, name: str | None, *, store_root: Path) -> tuple[Path, str, str, str]:
    """(source, format, family, variant) of an import: format ``gguf``, ``safetensors`` or ``bundle``. Raises 4xx errors."""
    source = imp.check_source_path(path)
    if source.resolve().is_relative_to(store_root):
        raise BadRequest("that path is already inside the model store", param="path", code="invalid_path")
    if source.is_file() and bundles.is_bundle(source):
        manifest = bundles.read_manifest(source)
        family, variant = parse_name(name) if name is not None else (manifest.family, manifest.variant)
        return source, "bundle", family or manifest.family, variant or manifest.variant
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
        guessed = names_from_filename(source.name)
    else:
        guessed = (slug(source.name), imp.guess_hf_variant(source))
    return source, fmt, given_family or guessed[0], given_variant or guessed[1]
