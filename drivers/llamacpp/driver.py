"""The llama.cpp driver: a plan → the argv of our continuous-batching worker.

The worker (``appliance.drivers.llamacpp.worker``) serves OpenAI-shaped HTTP
on a private Unix socket; see that module for the HTTP contract.
"""

from __future__ import annotations

import sys
from pathlib import Path

from appliance.drivers import EnginePlan, EngineSettings

#: n-gram size for prompt-lookup drafts when a plan asks for speculative decoding.
SPEC_NGRAM = 3

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models"})


def worker_command(plan: EnginePlan, socket_path: str | Path, python: str = sys.executable) -> list[str]:
    """The worker's argv for ``plan``. Pure: reads only the plan's attributes.

    Required plan attributes: ``model_path``, ``context`` (tokens per request),
    ``parallel``, ``threads``, ``n_gpu_layers``, ``model`` (served name).
    Optional: ``speculative`` (bool), ``batch_size`` (int), ``embedding`` (bool).
    """
    argv = [
        python, "-m", "appliance.drivers.llamacpp.worker",
        "--model", str(plan.model_path),
        "--socket", str(socket_path),
        "--served-name", str(plan.model),
        "--ctx", str(int(plan.context)),
        "--parallel", str(int(plan.parallel)),
        "--threads", str(int(plan.threads)),
        "--n-gpu-layers", str(int(plan.n_gpu_layers)),
    ]
    batch = getattr(plan, "batch_size", None)
    if batch:
        argv += ["--batch-size", str(int(batch))]
    if getattr(plan, "speculative", False):
        argv += ["--spec-ngram", str(SPEC_NGRAM)]
    if getattr(plan, "embedding", False):
        argv.append("--embedding")
    return argv


class LlamaCppDriver:
    """Driver protocol implementation (see ``appliance.drivers.Driver``)."""

    name = "llamacpp"
    routes = ROUTES
    health_path = "/health"

    def command(self, plan: EnginePlan, socket_path: Path, settings: EngineSettings | None = None) -> list[str]:
        """The worker runs on the daemon's own interpreter."""
        return worker_command(plan, socket_path)

    def environment(self, plan: EnginePlan, settings: EngineSettings | None = None) -> dict[str, str]:
        # libllama's own OpenMP/BLAS pools must not oversubscribe the cores the plan gave us.
        return {"OMP_NUM_THREADS": str(int(plan.threads))}

    def client_headers(self, plan: EnginePlan) -> dict[str, str]:
        """None: the worker's socket is reachable by the daemon's user only (mode 0600)."""
        return {}
