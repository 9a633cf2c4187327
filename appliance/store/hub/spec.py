"""The pull spec ``hf:ORG/REPO[:QUANT|/FILE][@REVISION]``, parsed and checked before anything is requested.

``hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M`` names a quantization (any case),
``hf:org/repo/sub/model-Q8_0.gguf`` one file of the repository (the first part,
for a split set), ``hf:org/repo`` lets the planner choose. The revision (a branch,
tag or commit) defaults to ``main``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeGuard

from appliance.errors import BadRequest
from appliance.store.errors import UnsafePath

PREFIX = "hf:"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,31}$")
MAX_PATH = 512


@dataclass(frozen=True)
class HubSpec:
    repo: str  # ORG/REPO
    revision: str = "main"
    quant: str | None = None  # as given; matched case-insensitively
    file: str | None = None  # a path inside the repository

    def __str__(self) -> str:
        what = f"/{self.file}" if self.file else f":{self.quant}" if self.quant else ""
        return f"{PREFIX}{self.repo}{what}" + ("" if self.revision == "main" else f"@{self.revision}")


def is_hub_spec(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value.startswith(PREFIX)


def check_repo_path(path: object, what: str = "the file") -> str:
    """A relative path inside a repository: no ``..``, no absolute path, no backslash or control character."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise UnsafePath(f"{what} has no valid path")
    if path.startswith("/") or "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise UnsafePath(f"{what} names an unsafe path")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or PurePosixPath(path).is_absolute():
        raise UnsafePath(f"{what} names an unsafe path")
    return path


def parse_spec(raw: object) -> HubSpec:
    """``hf:ORG/REPO[:QUANT|/FILE][@REVISION]`` → :class:`HubSpec`; BadRequest naming ``url`` otherwise."""
    if not is_hub_spec(raw) or len(raw) > 1024:
        raise BadRequest("a hub pull is hf:ORG/REPO[:QUANT|/FILE][@REVISION]", param="url", code="invalid_url")
    body = str(raw)[len(PREFIX) :]
    revision = "main"
    if "@" in body:
        body, revision = body.rsplit("@", 1)
        if not _REVISION.fullmatch(revision):
            raise BadRequest("the revision must be a branch, tag or commit name", param="url", code="invalid_url")
    org, _, rest = body.partition("/")
    name, slash, file = rest.partition("/")
    quant = None
    if not slash:
        name, colon, quant_text = name.partition(":")
        if colon:
            if not _QUANT.fullmatch(quant_text):
                raise BadRequest("the quantization must be a name like Q4_K_M", param="url", code="invalid_url")
            quant = quant_text
    if not (_PART.fullmatch(org) and _PART.fullmatch(name)) or ".." in org or ".." in name:
        raise BadRequest("a hub pull is hf:ORG/REPO[:QUANT|/FILE][@REVISION]", param="url", code="invalid_url")
    if slash:
        check_repo_path(file, "the spec")
        if not file.lower().endswith(".gguf"):
            raise BadRequest(
                "only a .gguf file can be named; name no file to pull a safetensors repository", param="url", code="invalid_url"
            )
    return HubSpec(repo=f"{org}/{name}", revision=revision, quant=quant, file=file or None)
