"""Names and paths in the model store, checked before anything touches the disk.

A model name is ``family`` or ``family:variant``; each part matches
``^[a-z0-9][a-z0-9._-]{0,63}$`` (no slash, no leading dot, so never ``..``).
Every path the store builds or reads back from the database is resolved and
must stay inside the store root, and no component below the root may be a
symlink: a planted link cannot redirect a write or a delete outside the store.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from appliance.errors import BadRequest, ConfigError
from appliance.store.errors import UnsafePath
from appliance.store.split_gguf import part_name

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
QUANT_SUFFIX = re.compile(r"[-._](f32|f16|bf16|q[2-8]_k(?:_[sml])?|q[4-8]_[01]|iq[1-4]_[a-z]+)$")
MAX_NAME = 129  # family + ":" + variant


def check_part(value: object, what: str) -> str:
    """One name part (family or variant), or BadRequest. Never echoes control characters."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        shown = value if isinstance(value, str) and value.isprintable() and len(value) <= MAX_NAME else "the given value"
        raise BadRequest(
            f"invalid {what} name {shown!r}: use lowercase letters, digits, '.', '_' and '-', starting with a letter or digit",
            param="name",
            code="invalid_model_name",
        )
    return value


def parse_name(name: object) -> tuple[str, str | None]:
    """``family[:variant]`` → (family, variant or None)."""
    if not isinstance(name, str) or len(name) > MAX_NAME or "\x00" in name:
        raise BadRequest("invalid model name", param="name", code="invalid_model_name")
    family, sep, variant = name.partition(":")
    check_part(family, "family")
    if not sep:
        return family, None
    return family, check_part(variant, "variant")


def full_name(family: str, variant: str) -> str:
    return f"{family}:{variant}"


class StoreLayout:
    """``<root>/<family>/<variant>/<family>-<variant>.gguf`` or ``<root>/<family>/<variant>/`` (HF folder)."""

    def __init__(self, root: Path, *, create: bool = True):
        if create:
            root.mkdir(parents=True, exist_ok=True, mode=0o750)
        elif not root.is_dir():
            raise ConfigError("the read-only model store (setting store_read_only) needs its folder, models in the data dir")
        self.root = root.resolve(strict=True)

    def inside(self, path: Path) -> Path:
        """``path`` resolved; raises UnsafePath unless it stays in the store with no symlink on the way."""
        if "\x00" in str(path):
            raise UnsafePath("path contains a NUL byte")
        candidate = path if path.is_absolute() else self.root / path
        resolved = Path(os.path.realpath(candidate))
        if resolved == self.root or not resolved.is_relative_to(self.root):
            raise UnsafePath("path leaves the model store")
        # realpath already followed links; also refuse links that point back inside.
        try:
            parts = Path(os.path.normpath(candidate)).relative_to(self.root).parts
        except ValueError:
            raise UnsafePath("path leaves the model store") from None
        current = self.root
        for part in parts:
            current = current / part
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                break
            if stat.S_ISLNK(mode):
                raise UnsafePath("symlinks are not allowed in the model store")
        return resolved

    def variant_dir(self, family: str, variant: str) -> Path:
        return self.inside(self.root / check_part(family, "family") / check_part(variant, "variant"))

    def family_dir(self, family: str) -> Path:
        return self.inside(self.root / check_part(family, "family"))

    def staging_dir(self, family: str, variant: str) -> Path:
        """Where an HF folder is assembled before its atomic rename (a dot name no model can have)."""
        return self.inside(self.family_dir(family) / f".{check_part(variant, 'variant')}.partial")

    def gguf_file(self, family: str, variant: str) -> Path:
        return self.inside(self.variant_dir(family, variant) / f"{family}-{variant}.gguf")

    def gguf_parts(self, family: str, variant: str, count: int) -> list[Path]:
        """The parts of a split GGUF variant, named as llama.cpp looks for them beside the first."""
        vdir = self.variant_dir(family, variant)
        return [self.inside(vdir / part_name(f"{family}-{variant}", number, count)) for number in range(1, count + 1)]

    def partial_file(self, family: str, variant: str) -> Path:
        final = self.gguf_file(family, variant)
        return final.with_name(final.name + ".partial")

    def relative(self, path: Path) -> str:
        return self.inside(path).relative_to(self.root).as_posix()

    def absolute(self, relative: str) -> Path:
        """A path read back from the database, checked again (the DB is not trusted blindly)."""
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts:
            raise UnsafePath("stored path leaves the model store")
        return self.inside(self.root / rel)

    def trash_dir(self) -> Path:
        trash = self.root / ".trash"
        trash.mkdir(exist_ok=True, mode=0o750)
        if trash.is_symlink():
            raise UnsafePath("symlinks are not allowed in the model store")
        return trash


def slug(text: str) -> str:
    out = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return (out or "model")[:64].rstrip("-._") or "model"


def names_from_filename(filename: str) -> tuple[str, str]:
    """``Llama-3.2-1B-Instruct-Q4_K_M.gguf`` → (``llama-3.2-1b-instruct``, ``q4_k_m``)."""
    stem = filename[:-5] if filename.lower().endswith(".gguf") else filename
    stem = stem.lower()
    match = QUANT_SUFFIX.search(stem)
    if match:
        return slug(stem[: match.start()]), match.group(1)
    return slug(stem), "gguf"
