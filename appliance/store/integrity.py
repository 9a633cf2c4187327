"""A variant's files as they are on disk now: their size and their sha256.

Measured the same way for one GGUF file, a GGUF model in parts (:mod:`appliance.store.split_gguf`) and a
safetensors folder (:func:`appliance.store.imports.hash_tree`), so they compare with what was recorded at install.
"""

from __future__ import annotations

from pathlib import Path

from appliance.store import imports as imp
from appliance.store import split_gguf
from appliance.store.jobs import JobContext


def size_on_disk(path: Path, fmt: str) -> int:
    """Bytes of a variant's files (raises OSError when one is missing)."""
    if fmt == "gguf":
        return split_gguf.size_of(path)
    return sum(f.size for f in imp.tree_files(path))


def digest_on_disk(path: Path, fmt: str, ctx: JobContext, *, expected_size: int) -> tuple[str, int]:
    """(sha256, size) of a variant's files; ``expected_size`` paces the progress of a single file."""
    if fmt == "gguf" and split_gguf.is_split(path):
        return split_gguf.hash_parts(path, ctx)
    if fmt == "gguf":
        return imp.hash_file(path, ctx, total=expected_size), path.stat().st_size
    return imp.hash_tree(path, ctx)
