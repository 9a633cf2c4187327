"""vLLM: the high-throughput backend for capable GPUs (and, for tests, the CPU).

The engine is vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``,
run by the interpreter of a separate environment (``settings.vllm_python``; see
``tests/vllm_env.sh``) and listening on the instance's private Unix socket.

Three things keep it behind the gateway:

- it listens on a Unix socket only (``--uds``), never on TCP;
- the gateway forwards an allow-list of routes (:attr:`VllmDriver.routes`, through
  ``EngineProcess.route``): vLLM's ``--api-key`` does not cover every route
  (``/invocations``, ``/tokenize``, ...);
- it still requires a random per-instance key on ``/v1``. The key travels in the
  environment (``VLLM_API_KEY``, readable by the same user only), not on the command
  line, where ``ps`` would show it to every local user; the supervisor's HTTP client
  sends it (:meth:`VllmDriver.client_headers`).

``--trust-remote-code`` is never passed: model folders are data, not code.
"""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path

from appliance.drivers import EnginePlan, EngineSettings
from appliance.drivers.errors import PlanNotServable

ENTRYPOINT = "vllm.entrypoints.openai.api_server"

#: Plan quantizations (the catalog's ``awq-int4`` or the planner's ``AWQ_INT4``) → ``--quantization``.
#: Naming the method still lets vLLM pick its fastest kernel for it (``awq`` → AutoAWQ/Marlin on GPUs).
_QUANTIZATION = {"awq": "awq", "gptq": "gptq", "fp8": "fp8"}
#: Methods a checkpoint declares in its ``quantization_config``; vLLM reads them from there.
_FROM_CHECKPOINT = {"compressed-tensors", "mxfp4", "mxfp4-moe"}
#: Plan quantizations that mean "unquantized weights": vLLM reads the dtype from the checkpoint.
_UNQUANTIZED = {"", "none", "bf16", "bfloat16", "f16", "fp16", "float16", "f32", "fp32", "float32"}
#: KV-cache types vLLM accepts from a plan; ``auto`` (or the llama.cpp default ``f16``) means
#: "the model's dtype" and passes nothing.
_KV_CACHE_DTYPES = {"bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"}
_KV_DEFAULT = {"", "auto", "f16"}
#: Family name patterns → vLLM's tool-call parser (the family's call syntax), first match wins.
_TOOL_PARSERS = (
    (re.compile(r"deepseek-r1"), None),
    (re.compile(r"qwen"), "hermes"),
    (re.compile(r"llama-?3"), "llama3_json"),
    (re.compile(r"mistral|mixtral"), "mistral"),
)
#: Family name patterns → vLLM's reasoning parser (``<think>`` traces into ``reasoning_content``).
_REASONING_PARSERS = ((re.compile(r"deepseek-r1"), "deepseek_r1"), (re.compile(r"qwen3"), "qwen3"))


def interpreter(settings: EngineSettings) -> str:
    """The Python that runs vLLM: ``settings.vllm_python``, else the appliance's own."""
    configured = getattr(settings, "vllm_python", None)
    return str(configured) if configured else sys.executable


def quantization_arg(quantization: str | None) -> str | None:
    """``awq-int4``/``AWQ_INT4`` → ``awq``; unquantized or checkpoint-declared → None; GGUF types are refused."""
    name = (quantization or "").strip().lower().replace("_", "-")
    if name in _UNQUANTIZED or name in _FROM_CHECKPOINT:
        return None
    method = name.split("-", 1)[0]
    if method in _QUANTIZATION:
        return _QUANTIZATION[method]
    raise PlanNotServable(f"vLLM does not serve {quantization!r} weights (GGUF quantizations are llama.cpp's)")


def kv_cache_dtype_arg(kv_cache_dtype: str | None) -> str | None:
    name = (kv_cache_dtype or "").strip().lower()
    if name in _KV_DEFAULT:
        return None
    if name in _KV_CACHE_DTYPES:
        return name
    raise PlanNotServable(f"vLLM has no KV-cache type {kv_cache_dtype!r}; use one of auto, {', '.join(sorted(_KV_CACHE_DTYPES))}")


def chat_parser_args(model: str) -> list[str]:
    """Tool-call and reasoning parsers for a model named ``family:variant`` (or a hub name). Pure.

    Qwen writes Hermes ``<tool_call>`` blocks, Llama 3.x JSON calls, Mistral ``[TOOL_CALLS]``;
    the DeepSeek-R1 distills think in ``<think>`` and are not tool-call models.
    """
    family = model.split(":", 1)[0].lower()
    argv: list[str] = []
    parser = next((p for pattern, p in _TOOL_PARSERS if pattern.search(family)), None)
    if parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    reasoning = next((p for pattern, p in _REASONING_PARSERS if pattern.search(family)), None)
    if reasoning is not None:
        argv += ["--reasoning-parser", reasoning]
    return argv


def build_args(plan: EnginePlan, socket_path: Path | str, settings: EngineSettings) -> list[str]:
    """The engine's argv for ``plan``. Pure: no I/O, no environment reads."""
    argv = [
        interpreter(settings),
        "-m",
        ENTRYPOINT,
        "--model",
        str(plan.model_path),
        "--served-model-name",
        plan.model,
        "--uds",
        str(socket_path),
        "--max-model-len",
        str(int(plan.context)),
        "--max-num-seqs",
        str(max(1, int(plan.parallel))),
        "--enable-prefix-caching",
        # usage.prompt_tokens_details.cached_tokens: the gateway meters prefix-cache hits.
        "--enable-prompt-tokens-details",
        # One line per request in the appliance log is the gateway's job, not the engine's.
        "--disable-uvicorn-access-log",
        *chat_parser_args(plan.model),
    ]
    utilization = getattr(plan, "gpu_memory_utilization", None)
    if utilization is not None:
        if not 0.0 < float(utilization) <= 1.0:
            raise PlanNotServable(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
        argv += ["--gpu-memory-utilization", f"{float(utilization):.4g}"]
    if (kv := kv_cache_dtype_arg(getattr(plan, "kv_cache_dtype", None))) is not None:
        argv += ["--kv-cache-dtype", kv]
    if (quant := quantization_arg(getattr(plan, "quantization", None))) is not None:
        argv += ["--quantization", quant]
    tp = int(getattr(plan, "tensor_parallel_size", 1) or 1)
    pp = int(getattr(plan, "pipeline_parallel_size", 1) or 1)
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        argv += ["--pipeline-parallel-size", str(pp)]
    if getattr(plan, "distributed_executor", None) == "ray":
        if not getattr(settings, "ray_address", None):
            # Without RAY_ADDRESS vLLM would start a private one-node Ray instead of joining the cluster.
            raise PlanNotServable("the plan spans a Ray cluster but ray_address is not set")
        argv += ["--distributed-executor-backend", "ray"]
    return argv


def _device_indices(devices: Iterable[str] | None, kind: str) -> list[str]:
    """``("cuda:0", "cuda:2")`` → ``["0", "2"]`` for ``kind`` ``cuda``."""
    out = []
    for device in devices or ():
        match = re.fullmatch(rf"{kind}:(\d+)", str(device).strip().lower())
        if match:
            out.append(match.group(1))
    return out


def build_env(plan: EnginePlan, settings: EngineSettings, api_key: str) -> dict[str, str]:
    """Environment added to the engine's: key, privacy, devices, Ray. Pure."""
    env = {
        "VLLM_API_KEY": api_key,
        # An on-prem appliance phones nobody: no usage statistics, no model hub.
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # Progress bars redraw one line with \r; the supervisor reads the log by lines.
        "TQDM_DISABLE": "1",
        # vLLM logs to stdout by default; the supervisor copies stderr into the appliance log
        # (and quotes its last line when a load fails).
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    }
    data_dir = getattr(settings, "data_dir", None)
    if data_dir is not None:
        # Compiled kernels are cached in the data dir: the service may write nowhere else
        # (systemd ProtectHome/ProtectSystem), and a warm cache makes the next load faster.
        cache = Path(data_dir) / "cache"
        env.update(
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(cache / "torchinductor"),
            TRITON_CACHE_DIR=str(cache / "triton"),
            HF_HOME=str(cache / "huggingface"),
        )
    ray = getattr(plan, "distributed_executor", None) == "ray"
    if getattr(settings, "ray_address", None):
        env["RAY_ADDRESS"] = str(settings.ray_address)
        env["RAY_USAGE_STATS_ENABLED"] = "0"  # the driver vLLM starts in the cluster reports nothing either
    if not ray:  # Ray assigns GPUs to its workers itself
        devices = getattr(plan, "devices", ())
        cuda, rocm = _device_indices(devices, "cuda"), _device_indices(devices, "rocm")
        if cuda or rocm:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the planner numbers GPUs in PCI order
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda or rocm)
        if rocm:  # vLLM on ROCm insists both agree
            env["HIP_VISIBLE_DEVICES"] = ",".join(rocm)
    return env


class VllmDriver:
    """Driver for vLLM's OpenAI server. One instance per engine (it holds the engine's key)."""

    name = "vllm"
    #: Only pooling (embedding) models answer /v1/embeddings; plans for those do not exist yet.
    routes = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
    health_path = "/health"

    def __init__(self, api_key: str | None = None):
        self._api_key = api_key or secrets.token_urlsafe(32)

    def command(self, plan: EnginePlan, socket_path: Path, settings: EngineSettings) -> list[str]:
        return build_args(plan, socket_path, settings)

    def environment(self, plan: EnginePlan, settings: EngineSettings) -> dict[str, str]:
        return build_env(plan, settings, self._api_key)

    def client_headers(self, plan: EnginePlan) -> dict[str, str]:
        """Headers every request to this engine must carry (the supervisor's client sets them)."""
        return {"Authorization": f"Bearer {self._api_key}"}

    def __repr__(self) -> str:  # never show the key
        return "VllmDriver()"
