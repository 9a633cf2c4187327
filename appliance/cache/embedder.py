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

import concurrent.futures
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from appliance.settings import Settings

if TYPE_CHECKING:
    import llama_cpp

    from appliance.drivers.llamacpp.contention import ComputeThreads

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
    from appliance.store.imports import hash_file
    from appliance.store.jobs import NullContext

    return hash_file(path, NullContext())


class LlamaCppEmbedder:
    """A BERT-family GGUF embedding model run in-process by libllama.

    Every call computes on the embedder's own thread, whichever thread asks (the
    semantic tier's lookups and the cache writer both do), and the caller waits
    for it. libllama releases the GIL while it computes, so callers run ``embed``
    off the event loop and the loop keeps serving. One thread computing also
    keeps libgomp to one team of threads when ``threads`` > 1 (a second computing
    thread makes every graph's threads sleep at its barriers; see
    ``appliance.drivers.llamacpp.context``). The model is small enough that one
    compute thread is the right size on a box whose cores belong to the LLM engines.

    With ``threads`` > 1 the embedder gives threads up while other processes take
    the cores, as the engine worker does (``appliance.drivers.llamacpp.contention``):
    its OpenMP team would otherwise spin at each barrier for a descheduled member.
    :attr:`compute` holds the decision and its counters (None with one thread).
    """

    def __init__(self, path: Path = DEFAULT_MODEL, *, threads: int = 1, context: int = 512, name: str | None = None):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"embedding model not found: {path}")
        self.path = path
        self.name = name or path.stem
        self.context = context
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cache-embedder")
        try:
            model = self._thread.submit(self._load, threads).result()
        except BaseException:
            self._thread.shutdown()
            raise
        self._model: llama_cpp.Llama | None = model  # None once closed
        self.dim = int(model.n_embd())
        self.compute: ComputeThreads | None = None
        if threads > 1:
            from appliance.drivers.llamacpp.contention import ComputeThreads

            self.compute = ComputeThreads(threads, [_ContextThreads(model)])

    def _load(self, threads: int) -> llama_cpp.Llama:
        import llama_cpp

        return llama_cpp.Llama(
            model_path=str(self.path),
            embedding=True,
            n_ctx=self.context,
            n_batch=self.context,
            n_ubatch=self.context,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            rows = self._thread.submit(self._embed, list(texts)).result()
        except RuntimeError as exc:
            if self._model is None:  # closed (the executor refuses new work once shut down)
                raise RuntimeError("the embedding model is closed") from exc
            raise
        return normalize(np.asarray(rows, dtype=np.float32))

    def _embed(self, texts: list[str]) -> list[list[float]]:
        if self._model is None:
            raise RuntimeError("the embedding model is closed")
        t0 = time.perf_counter()
        rows = [self._model.embed(t, truncate=True) for t in texts]
        if self.compute is not None:  # on the embedder's thread, the one whose run-queue waits it reads
            chars = sum(len(t) for t in texts)  # the work, in characters: compared only within one size class
            self.compute.sample(("embed", len(texts), chars.bit_length()), chars, time.perf_counter() - t0)
            self.compute.tick()
        return rows

    def close(self) -> None:
        try:
            self._thread.submit(self._close).result()
        except RuntimeError:  # already closed
            return
        self._thread.shutdown()

    def _close(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            model.close()


class _ContextThreads:
    """The loaded model's context as a thread-count target (llama-cpp-python 0.3's context wrapper)."""

    def __init__(self, model: llama_cpp.Llama) -> None:
        self._model = model

    def set_threads(self, n: int) -> None:
        self._model._ctx.set_n_threads(n, n)


def make_embedder(settings: Settings) -> Embedder | None:
    """The embedder of the semantic tier, or None when the cache is off.

    It is loaded even when the tier is off by default, so that a team or key policy can turn it on.
    """
    if not settings.cache_enabled:
        return None
    return LlamaCppEmbedder(settings.cache_embedding_model or DEFAULT_MODEL, threads=settings.cache_embedding_threads)
