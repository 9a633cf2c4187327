"""The llama.cpp driver: a plan → the argv of our continuous-batching worker.

The worker (``appliance.drivers.llamacpp.worker``) serves OpenAI-shaped HTTP
on a private Unix socket; see that module for the HTTP contract.
"""

from __future__ import annotations

import sys
from pathlib import Path

from appliance.drivers import EnginePlan, EngineSettings
from appliance.drivers.llamacpp.placement import Placement, placement_of

#: n-gram size for prompt-lookup drafts when a plan asks for speculative decoding. Five rather
#: than three: three tokens recur by chance in sampled prose, and each draft that fails nearly
#: doubles its step (``speculation.py``). On the default model five kept 32-39% of the drafts at
#: temperature 1.0 (three: 13-32%) and 91-92% in copies of JSON and code (three: 75-77%);
#: ``tests/bench/bench_speculative.py``, figures in the manual's benchmarks.
SPEC_NGRAM = 5

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models"})


def plan_threads(plan: EnginePlan) -> int:
    """The compute threads of a llama.cpp plan (the planner always names them; only vLLM plans leave them out)."""
    if plan.threads is None:
        raise ValueError(f"the plan for {plan.model} names no thread count")
    return plan.threads


def worker_command(plan: EnginePlan, socket_path: str | Path, python: str = sys.executable) -> list[str]:
    """The worker's argv for ``plan``. Pure: reads only the plan's attributes.

    Required plan attributes: ``model_path``, ``context`` (tokens per request),
    ``parallel``, ``threads``, ``n_gpu_layers``, ``model`` (served name).
    Optional: ``speculative`` (bool), ``batch_size`` (int), ``embedding`` (bool), and the
    placement (``devices``, ``tensor_split``, ``kv_cache_dtype``, ``flash_attn``, ``swa_full``;
    see :func:`placement`).
    """
    argv = [
        python,
        "-m",
        "appliance.drivers.llamacpp.worker",
        "--model",
        str(plan.model_path),
        "--socket",
        str(socket_path),
        "--served-name",
        str(plan.model),
        "--ctx",
        str(int(plan.context)),
        "--parallel",
        str(int(plan.parallel)),
        "--threads",
        str(plan_threads(plan)),
        "--n-gpu-layers",
        str(int(plan.n_gpu_layers)),
        *placement(plan).args,
    ]
    batch = getattr(plan, "batch_size", None)
    if batch:
        argv += ["--batch-size", str(int(batch))]
    if getattr(plan, "speculative", False):
        argv += ["--spec-ngram", str(SPEC_NGRAM)]
    if getattr(plan, "embedding", False):
        argv.append("--embedding")
    return argv


def latency_args(targets: dict[str, dict[str, float]] | None) -> list[str]:
    """``--latency-targets`` for the settings' ``latency_targets`` (class → TTFT and TPOT p95 seconds); none when unset."""
    if not targets:
        return []
    spec = ",".join(f"{c}:{t['ttft_p95_s']:g}:{t['tpot_p95_s']:g}" for c, t in targets.items())
    return ["--latency-targets", spec]


def placement(plan: EnginePlan) -> Placement:
    """The plan's devices, layer split, KV cache type and attention kernel, as environment and flags."""
    return placement_of(
        devices=tuple(getattr(plan, "devices", ("cpu",)) or ("cpu",)),
        n_gpu_layers=int(plan.n_gpu_layers),
        tensor_split=tuple(getattr(plan, "tensor_split", ()) or ()),
        kv_type=str(getattr(plan, "kv_cache_dtype", "f16") or "f16"),
        flash_attn=str(getattr(plan, "flash_attn", "auto") or "auto"),
        swa_full=bool(getattr(plan, "swa_full", True)),
    )


def worker_environment(plan: EnginePlan) -> dict[str, str]:
    """The worker's added environment: thread pools sized to the plan, and only the plan's GPUs visible."""
    # libllama's own OpenMP/BLAS pools must not oversubscribe the cores the plan gave us.
    return {"OMP_NUM_THREADS": str(plan_threads(plan)), **placement(plan).env}


class LlamaCppDriver:
    """Driver protocol implementation (see ``appliance.drivers.Driver``)."""

    name = "llamacpp"
    routes = ROUTES
    health_path = "/health"

    def command(self, plan: EnginePlan, socket_path: Path, settings: EngineSettings | None = None) -> list[str]:
        """The worker runs on the daemon's own interpreter; the settings' latency targets pace its steps."""
        adapt = [] if getattr(settings, "engine_adapt_threads", False) else ["--adapt-threads", "off"]
        return worker_command(plan, socket_path) + latency_args(getattr(settings, "latency_targets", None)) + adapt

    def environment(self, plan: EnginePlan, settings: EngineSettings | None = None) -> dict[str, str]:
        return worker_environment(plan)

    def client_headers(self, plan: EnginePlan) -> dict[str, str]:
        """None: the worker's socket is reachable by the daemon's user only (mode 0600)."""
        return {}
