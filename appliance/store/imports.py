"""Bringing local files into the store: policy checks, hashed copies, tree digests.

Only GGUF files and Hugging Face folders of safetensors are accepted. A folder is
refused when it holds code (``*.py``), pickles (``.bin``, ``.pt``, ``.pth``,
``.pkl``, ``.ckpt`` …), any file type not on the short list below, a symlink,
or a ``*config.json`` that declares ``auto_map`` (remote code). Hidden entries
(``.git``, ``.cache``) are skipped, never copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from appliance.errors import BadRequest
from appliance.store.errors import RefusedImport
from appliance.store.jobs import JobContext

CHUNK = 1 << 20
MAX_FILES = 4096
MAX_DEPTH = 4
MAX_CONFIG_BYTES = 4 << 20

PICKLE_OR_CODE = {
    ".py",
    ".pyc",
    ".pyo",
    ".so",
    ".bin",
    ".pt",
    ".pth",
    ".pkl",
    ".pickle",
    ".ckpt",
    ".joblib",
    ".npy",
    ".npz",
    ".h5",
    ".msgpack",
    ".onnx",
    ".pb",
    ".ipynb",
    ".sh",
    ".exe",
    ".dll",
}
ALLOWED_SUFFIXES = {".safetensors", ".json", ".txt", ".md", ".model", ".jinja", ".tiktoken", ".vocab", ".yaml", ".yml", ".spm"}
ALLOWED_PLAIN = ("license", "notice", "readme", "use_policy", "copying")


@dataclass(frozen=True)
class SourceFile:
    relative: PurePosixPath
    size: int


def check_source_path(raw: object) -> Path:
    """An import source: absolute, no NUL, and not itself a symlink."""
    if not isinstance(raw, str) or not raw or len(raw) > 4096 or "\x00" in raw:
        raise BadRequest("invalid path", param="path", code="invalid_path")
    path = Path(raw)
    if not path.is_absolute() or ".." in path.parts:
        raise BadRequest("the import path must be absolute, without '..'", param="path", code="invalid_path")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        raise BadRequest("nothing to import at that path", param="path", code="invalid_path") from None
    if stat.S_ISLNK(mode):
        raise RefusedImport("symlinks are refused; give the real path", param="path")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise RefusedImport("only a GGUF file or a Hugging Face folder can be imported", param="path")
    return path


def refusal(rel: PurePosixPath) -> str | None:
    suffix = rel.suffix.lower()
    if suffix in PICKLE_OR_CODE:
        kind = (
            "code"
            if suffix in {".py", ".pyc", ".pyo", ".so", ".ipynb", ".sh", ".exe", ".dll"}
            else "a pickle or non-safetensors weight file"
        )
        return f"{rel} is {kind}; only safetensors weights are accepted"
    if suffix in ALLOWED_SUFFIXES:
        return None
    if not suffix and rel.name.lower().startswith(ALLOWED_PLAIN):
        return None
    return f"{rel} is not a file type the appliance imports (safetensors, JSON, tokenizer and text files only)"


def scan_hf_folder(folder: Path) -> list[SourceFile]:
    """Every file to copy from an HF folder, after the policy checks (nothing is read but configs)."""
    files: list[SourceFile] = []

    def walk(current: Path, rel: PurePosixPath, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise RefusedImport(f"{rel} is nested too deep")
        with os.scandir(current) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.startswith("."):
                    continue
                child = rel / entry.name
                if entry.is_symlink():
                    raise RefusedImport(f"{child} is a symlink; symlinks are refused")
                if entry.is_dir(follow_symlinks=False):
                    walk(Path(entry.path), child, depth + 1)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    raise RefusedImport(f"{child} is not a regular file")
                why = refusal(child)
                if why:
                    raise RefusedImport(why)
                files.append(SourceFile(child, entry.stat(follow_symlinks=False).st_size))
                if len(files) > MAX_FILES:
                    raise RefusedImport(f"more than {MAX_FILES} files")

    walk(folder, PurePosixPath(), 0)
    names = {f.relative.as_posix() for f in files}
    if "config.json" not in names:
        raise RefusedImport("a Hugging Face folder needs a config.json")
    if not any(f.relative.suffix == ".safetensors" for f in files):
        raise RefusedImport("the folder has no .safetensors weights")
    for f in files:
        if f.relative.name.endswith("config.json"):
            _refuse_remote_code(folder / f.relative, f)
    return files


def _refuse_remote_code(path: Path, f: SourceFile) -> None:
    if f.size > MAX_CONFIG_BYTES:
        raise RefusedImport(f"{f.relative} is too large for a config file")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        raise RefusedImport(f"{f.relative} is not valid JSON") from None
    if isinstance(data, dict) and "auto_map" in data:
        raise RefusedImport(f"{f.relative} declares auto_map: the model needs remote code, which the appliance never runs")


_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def guess_hf_variant(folder: Path) -> str:
    """A variant name from config.json: ``awq-int4``, ``gptq-int4``, ``fp8``, ``bf16`` … (``hf`` when unsure)."""
    try:
        path = folder / "config.json"
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return "hf"
        cfg = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return "hf"
    if not isinstance(cfg, dict):
        return "hf"
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        method = quant["quant_method"].lower()
        bits = quant.get("bits") if isinstance(quant.get("bits"), int) else None
        name = f"{method}-int{bits}" if bits else method
        return name if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name) else "hf"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return _DTYPES.get(dtype, "hf") if isinstance(dtype, str) else "hf"


def copy_file(src: Path, dst: Path, ctx: JobContext, *, done_before: int = 0, total: int | None = None) -> tuple[str, int]:
    """Copy without following a symlink, hashing on the way; fsync the copy. Returns (sha256, size)."""
    digest = hashlib.sha256()
    size = 0
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fin:
        if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
            raise RefusedImport("only regular files can be imported")
        with dst.open("wb") as fout:
            while block := fin.read(CHUNK):
                ctx.check_cancelled()
                fout.write(block)
                digest.update(block)
                size += len(block)
                ctx.progress(done_before + size, total)
            fout.flush()
            os.fsync(fout.fileno())
    return digest.hexdigest(), size


def hash_file(path: Path, ctx: JobContext, *, done_before: int = 0, total: int | None = None) -> str:
    digest = hashlib.sha256()
    done = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            ctx.check_cancelled()
            digest.update(block)
            done += len(block)
            ctx.progress(done_before + done, total)
    return digest.hexdigest()


def tree_files(folder: Path) -> list[SourceFile]:
    """Files of a stored HF folder, in a stable order (symlinks were refused on import)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            out.append(SourceFile(PurePosixPath(full.relative_to(folder).as_posix()), full.lstat().st_size))
    return sorted(out, key=lambda f: f.relative.as_posix())


def tree_digest(entries: list[tuple[str, int, str]]) -> str:
    """One sha256 for a folder: over the sorted lines ``path<TAB>size<TAB>sha256``."""
    manifest = "".join(f"{rel}\t{size}\t{sha}\n" for rel, size, sha in sorted(entries))
    return hashlib.sha256(manifest.encode()).hexdigest()


def hash_tree(folder: Path, ctx: JobContext) -> tuple[str, int]:
    files = tree_files(folder)
    total = sum(f.size for f in files)
    done = 0
    entries = []
    for f in files:
        entries.append((f.relative.as_posix(), f.size, hash_file(folder / f.relative, ctx, done_before=done, total=total)))
        done += f.size
    return tree_digest(entries), total
