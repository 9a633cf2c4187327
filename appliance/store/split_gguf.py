"""GGUF models split into parts: ``<prefix>-00001-of-00003.gguf`` … ``<prefix>-00003-of-00003.gguf``.

llama.cpp is given the first part and opens the others from the same folder by
this naming, so the store keeps the parts side by side under exactly these names.
A split variant's size is the sum of its parts, and its sha256 is the digest over
the lines ``name<TAB>size<TAB>sha256`` of its parts (:func:`imports.tree_digest`).
"""

from __future__ import annotations

import re
from pathlib import Path

from appliance.store import imports as imp
from appliance.store.jobs import JobContext

SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
MAX_PARTS = 256


def part_name(prefix: str, number: int, count: int) -> str:
    """llama.cpp's name of part ``number`` (1-based) of ``count``."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def parts_of(first: Path) -> list[Path]:
    """All parts of the split model whose first part is ``first``; ``[first]`` for a single file."""
    match = SPLIT_RE.match(first.name)
    if match is None or int(match.group("no")) != 1:
        return [first]
    count = int(match.group("count"))
    return [first.with_name(part_name(match.group("prefix"), i, count)) for i in range(1, count + 1)]


def is_split(path: Path) -> bool:
    return len(parts_of(path)) > 1


def size_of(first: Path) -> int:
    """Bytes of all parts (raises OSError when one is missing)."""
    return sum(p.stat().st_size for p in parts_of(first))


def hash_parts(first: Path, ctx: JobContext) -> tuple[str, int]:
    """(digest, size) of a split model, as recorded at install."""
    parts = parts_of(first)
    total = sum(p.stat().st_size for p in parts)
    entries, done = [], 0
    for part in parts:
        size = part.stat().st_size
        entries.append((part.name, size, imp.hash_file(part, ctx, done_before=done, total=total)))
        done += size
    return imp.tree_digest(entries), total
