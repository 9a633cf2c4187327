"""Sentence embeddings for the semantic cache, served by the appliance's own llama.cpp.

The default model is sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0,
384 dimensions, mean pooling), shipped inside the package as a 25 MB Q8_0 GGUF
(``appliance/cache/embedding_models/``; how it was made is in the README there). It
loads in ~40 ms and embeds a short prompt in ~8 ms on one CPU thread, with no
network, no torch and no extra dependency: llama-cpp-python is already the
appliance's engine.

Anything with ``embed(texts) -> np.ndarray`` (float32, one L2-normalized row
per text) can stand in for it; tests and other deployments inject their own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from appliance.settings import Settings

if TYPE_CHECKING:
    import llama_cpp

MODELS_DIR = Path(__file__).parent / "embedding_models"
DEFAULT_MODEL = MODELS_DIR / "all-MiniLM-L6-v2.Q8_0.gguf"
DEFAULT_MODEL_SHA256 = "e2b1264561f667cc8259f5a92d915a5cc7bbec62443096878fcb7d2b60feb80f"


class Embedder(Protocol):
    """Embeds texts: one float32, L2-normalized row per text."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def file_sha256(path: Path) -> str:
    from appliance.store.jobs import NullContext
    from appliance.store.imports import hash_file

    return hash_file(path, NullContext())


class LlamaCppEmbedder:
    """A BERT-family GGUF embedding model run in-process by libllama.

    libllama releases the GIL while it computes, so callers run ``embed`` on a
    worker thread and the event loop keeps serving. One context serves one
    call at a time (a lock); the model is small enough that one thread is the
    right size on a box whose cores belong to the LLM engines.
    """

    def __init__(self, path: Path = DEFAULT_MODEL, *, threads: int = 1, context: int = 512, name: str | None = None):
        import llama_cpp

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"embedding model not found: {path}")
        self.path = path
        self.name = name or path.stem
        self.context = context
        self._lock = threading.Lock()
        self._model: llama_cpp.Llama | None = llama_cpp.Llama(
            model_path=str(path), embedding=True, n_ctx=context, n_batch=context, n_ubatch=context,
            n_threads=threads, n_threads_batch=threads, verbose=False,
        )
        self.dim = int(self._model.n_embd())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            if self._model is None:
                raise RuntimeError("the embedding model is closed")
            rows = [self._model.embed(t, truncate=True) for t in texts]
        return normalize(np.asarray(rows, dtype=np.float32))

    def close(self) -> None:
        with self._lock:
            model, self._model = self._model, None
            if model is not None:
                model.close()


def make_embedder(settings: Settings) -> Embedder | None:
    """The embedder of the semantic tier, or None when the cache is off.

    It is loaded even when the tier is off by default, so that a team or key policy can turn it on.
    """
    if not settings.cache_enabled:
        return None
    return LlamaCppEmbedder(settings.cache_embedding_model or DEFAULT_MODEL, threads=settings.cache_embedding_threads)
