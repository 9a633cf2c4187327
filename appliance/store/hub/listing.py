"""A repository's files as the hub lists them, checked, and the variants they make.

The tree listing (``GET /api/models/{repo}/tree/{revision}?recursive=true``) gives
entries with ``path``, ``size`` and, for files kept in LFS, ``lfs.oid`` (their
sha256). The model info (``GET /api/models/{repo}[/revision/{revision}]?blobs=true``)
lists the same files as ``siblings``: ``rfilename``, and ``size`` and ``lfs.sha256``
when the hub gives them (a mirror may not; the client then asks the file's size with
a HEAD request, see :func:`wanted`). Every path is checked before it is used (a listing naming ``../x`` or
``/etc/x`` is refused whole). GGUF files become variants named after their
quantization; the parts of a split set (``*-00001-of-00003.gguf``) become one
variant, and an incomplete set none. A repository without GGUF files becomes one
safetensors variant for vLLM: the weight shards, their index, the config, the
generation config and the tokenizer files, nothing else (no code, no pickles).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from appliance.jsontypes import JsonValue
from appliance.store.errors import RefusedImport, UpstreamError
from appliance.store.hub.spec import check_repo_path
from appliance.store.split_gguf import MAX_PARTS, SPLIT_RE

MAX_ENTRIES = 20_000
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_QUANT = re.compile(
    r"(?:^|[-._])(f32|f16|bf16|q[2-8]_k(?:_[sml])?|q[4-8]_[01]|iq[1-4]_[a-z]+|iq4_nl|tq[12]_0|mxfp4)(?=$|[-._])", re.IGNORECASE
)
HF_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
}


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # LFS files only; small files are hashed as they arrive

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class GgufSet:
    """One GGUF variant in a repository: a single file, or the parts of a split set in order."""

    variant: str  # lowercase: q4_k_m, f16, or a slug of the file name
    quant: str | None  # as the file name spells it: Q4_K_M
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def split(self) -> bool:
        return len(self.files) > 1


def files_from_tree(payload: JsonValue) -> list[HubFile]:
    """Files of a tree listing (folders are skipped); UnsafePath for a path that could leave the store."""
    if not isinstance(payload, list):
        raise UpstreamError("the hub's file listing is not a list")
    if len(payload) > MAX_ENTRIES:
        raise RefusedImport(f"the repository lists more than {MAX_ENTRIES} entries")
    files = []
    for entry in payload:
        if not isinstance(entry, dict) or entry.get("type") not in ("file", "directory"):
            raise UpstreamError("the hub's file listing has an entry of an unknown shape")
        path = check_repo_path(entry.get("path"), "the hub's listing")
        if entry["type"] == "directory":
            continue
        size = entry.get("size")
        if not isinstance(size, int) or size < 0:
            raise UpstreamError(f"the hub's listing gives {path} no size")
        lfs = entry.get("lfs")
        oid = lfs.get("oid") if isinstance(lfs, dict) else None
        sha = oid.lower() if isinstance(oid, str) and _SHA256.fullmatch(oid.lower()) else None
        if isinstance(lfs, dict) and lfs.get("size") not in (None, size):
            raise UpstreamError(f"the hub's listing gives {path} two sizes")
        files.append(HubFile(path, size, sha))
    return files


@dataclass(frozen=True)
class Sibling:
    """A file of the model info's ``siblings``: its size and sha256 only when the hub listed them."""

    path: str
    size: int | None
    sha256: str | None


def siblings_from_info(payload: JsonValue) -> list[Sibling] | None:
    """The files of a model info answer; None when it lists no ``siblings`` (a mirror that leaves them out)."""
    if not isinstance(payload, dict):
        raise UpstreamError("the hub's model info is not an object")
    siblings = payload.get("siblings")
    if siblings is None:
        return None
    if not isinstance(siblings, list):
        raise UpstreamError("the hub's model info lists its files in an unknown shape")
    if len(siblings) > MAX_ENTRIES:
        raise RefusedImport(f"the repository lists more than {MAX_ENTRIES} entries")
    out = []
    for entry in siblings:
        if not isinstance(entry, dict):
            raise UpstreamError("the hub's model info has a file of an unknown shape")
        path = check_repo_path(entry.get("rfilename"), "the hub's listing")
        size = entry.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise UpstreamError(f"the hub's listing gives {path} an invalid size")
        lfs = entry.get("lfs")
        digest = lfs.get("sha256") if isinstance(lfs, dict) else None
        sha = digest.lower() if isinstance(digest, str) and _SHA256.fullmatch(digest.lower()) else None
        if isinstance(lfs, dict) and size is not None and lfs.get("size") not in (None, size):
            raise UpstreamError(f"the hub's listing gives {path} two sizes")
        out.append(Sibling(path, size, sha))
    return out


def wanted(path: str) -> bool:
    """Whether a pull could take the file: a GGUF model, or what a safetensors variant takes from the top folder."""
    name = PurePosixPath(path).name
    if name.lower().endswith(".gguf"):
        return not name.lower().startswith("mmproj")
    return "/" not in path and (name.endswith(".safetensors") or name.endswith(".safetensors.index.json") or name in HF_FILES)


def quant_of(filename: str) -> str | None:
    """The quantization a GGUF file name spells (the last one it names), as spelled."""
    stem = filename[:-5] if filename.lower().endswith(".gguf") else filename
    found = list(_QUANT.finditer(stem))
    return found[-1].group(1) if found else None


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return (slug or "gguf")[:64].rstrip("-._") or "gguf"


def family_of(repo: str) -> str:
    """``bartowski/Qwen2.5-0.5B-Instruct-GGUF`` → ``qwen2.5-0.5b-instruct``."""
    name = repo.split("/", 1)[-1]
    name = re.sub(r"[-_.]gguf$", "", name, flags=re.IGNORECASE)
    return _slug(name)


def gguf_sets(files: list[HubFile]) -> list[GgufSet]:
    """The GGUF variants of a listing, smallest first; projector files (``mmproj``) are not models."""
    singles: list[tuple[HubFile, str]] = []
    groups: dict[tuple[str, str, int], dict[int, HubFile]] = {}
    for f in files:
        if not f.name.lower().endswith(".gguf") or f.name.lower().startswith("mmproj"):
            continue
        match = SPLIT_RE.match(f.name)
        if match is None:
            singles.append((f, f.name[:-5]))
            continue
        count, number = int(match.group("count")), int(match.group("no"))
        if not 1 <= number <= count <= MAX_PARTS:
            continue
        folder = str(PurePosixPath(f.path).parent)
        groups.setdefault((folder, match.group("prefix"), count), {})[number] = f
    sets: list[tuple[str, GgufSet]] = []
    for f, stem in singles:
        sets.append((stem, _make_set(stem, (f,))))
    for (_folder, prefix, count), parts in groups.items():
        if len(parts) == count:  # an incomplete set cannot load
            sets.append((prefix, _make_set(prefix, tuple(parts[i] for i in range(1, count + 1)))))
    seen: dict[str, int] = {}
    for _stem, s in sets:
        seen[s.variant] = seen.get(s.variant, 0) + 1
    out = []
    for stem, s in sets:  # two files of one quantization: name them after their files instead
        out.append(s if seen[s.variant] == 1 else GgufSet(_slug(stem), s.quant, s.files))
    return sorted(out, key=lambda s: (s.size, s.variant))


def _make_set(stem: str, files: tuple[HubFile, ...]) -> GgufSet:
    quant = quant_of(stem + ".gguf")
    return GgufSet(quant.lower() if quant else _slug(stem), quant, files)


def hf_selection(files: list[HubFile]) -> list[HubFile]:
    """What a safetensors variant takes from the repository's top folder; RefusedImport when it has no weights."""
    top = [f for f in files if "/" not in f.path]
    chosen = [
        f for f in top if f.name.endswith(".safetensors") or f.name.endswith(".safetensors.index.json") or f.name in HF_FILES
    ]
    if not any(f.name.endswith(".safetensors") for f in chosen):
        raise RefusedImport("the repository has neither GGUF files nor safetensors weights (pickled weights are never pulled)")
    if not any(f.name == "config.json" for f in chosen):
        raise RefusedImport("the repository's safetensors weights come without a config.json")
    return sorted(chosen, key=lambda f: f.path)
