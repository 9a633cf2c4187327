"""Inputs and outputs of the planner (:mod:`appliance.planner.plan`): plain frozen dataclasses.

``Plan`` is consumed by the engine supervisor and the drivers; its field names
are a contract. Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from appliance.errors import DoesNotFit
from appliance.hardware.snapshot import HardwareSnapshot
from appliance.hardware.units import GiB
from appliance.jsontypes import JsonObject
from appliance.modelfacts import ModelFacts


@dataclass(frozen=True)
class Variant:
    """One installed (or catalogued) variant of a model family."""

    family: str
    name: str
    format: str
    """``gguf`` or ``safetensors``."""
    quantization: str | None
    size_bytes: int
    facts: ModelFacts
    path: str = ""
    """Passed through to ``Plan.model_path`` (the store's path; the planner never opens it)."""

    @property
    def key(self) -> str:
        return f"{self.family}:{self.name}"


@dataclass(frozen=True)
class CalibrationPoint:
    """A measured load, as plain data (rows of the ``calibrations`` table)."""

    variant_key: str
    backend: str
    context: int
    estimated_bytes: int
    measured_bytes: int
    estimated_decode_tps: float | None = None
    """The planner's uncorrected decode tokens/s per stream at ``decode_streams`` (None: not measured)."""
    measured_decode_tps: float | None = None
    decode_streams: int | None = None


@dataclass(frozen=True)
class Preferences:
    """What the operator asks for; defaults match the Settings defaults."""

    min_context: int = 8192
    """Context tokens wanted per request (sequence); capped at the model's trained context."""
    parallel: int = 1
    """Concurrent sequences (llama.cpp slots, vLLM max_num_seqs)."""
    quality_floor: str | None = None
    """Lowest quantization accepted (``Q4_K_M``); None accepts all."""
    memory_margin: int = 1 * GiB
    """Bytes left free on every device."""
    vllm_available: bool = False
    llamacpp_gpu: bool = True
    """llama-cpp-python was built with a GPU backend (see ``SoftwareInfo.llamacpp_gpu``)."""
    ray_address: str | None = None
    cluster: tuple[HardwareSnapshot, ...] = ()
    """Other nodes of the Ray cluster at ``ray_address`` (for plans spanning nodes)."""
    backend: str = "auto"
    """``auto``, ``llamacpp`` or ``vllm``."""
    threads: int | None = None
    """Engine threads override (the ``engine_threads`` setting)."""
    kv_cache_dtype: str | None = None
    """None: ``f16`` for llama.cpp, ``auto`` for vLLM."""
    memory_budget: int | None = None
    """Most bytes one engine may use in all (the ``memory_budget_gib`` setting)."""
    swa_full: bool = True
    """llama.cpp: full-size KV for sliding-window layers (llama.cpp's default, which keeps prefix
    reuse exact). False plans the window-sized cache (Gemma 3 at 8 x 8192 tokens: 260 MiB of KV
    instead of 1152 MiB); the driver must then create the context with ``swa_full = plan.swa_full``."""
    speculative_ngram: bool = False
    """llama.cpp: prompt-lookup (n-gram) speculative decoding (the ``speculative_ngram`` setting)."""
    min_decode_tps: float = 10.0
    """Interactive floor: decode tokens/s per stream at ``parallel`` streams the chosen variant should reach
    (the ``min_decode_tokens_per_s`` setting); 0 ranks by quality alone."""


@dataclass(frozen=True)
class DeviceMemory:
    """The estimate for one device. ``headroom`` is what stays free after the load."""

    device: str
    weights: int
    kv_cache: int
    compute: int
    overhead: int
    free: int
    headroom: int

    @classmethod
    def of(cls, device: str, weights: int, kv_cache: int, compute: int, overhead: int, free: int) -> DeviceMemory:
        used = weights + kv_cache + compute + overhead
        return cls(device, int(weights), int(kv_cache), int(compute), int(overhead), int(free), int(free - used))

    @property
    def used(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.overhead


@dataclass(frozen=True)
class Plan:
    """How to run one variant: the engine supervisor and drivers consume these fields."""

    model: str
    """``family:variant``."""
    variant: str
    backend: str
    """``llamacpp`` or ``vllm``."""
    model_path: str
    context: int
    """Tokens per request (sequence) for both backends: vLLM's ``--max-model-len``; llama.cpp's
    unified KV cache holds ``context x parallel`` cells."""
    parallel: int
    threads: int | None
    n_gpu_layers: int
    """-1 all layers and the output head on GPU; 0 CPU only; else that many blocks."""
    devices: tuple[str, ...]
    """``cpu``, ``cuda:0``, ``rocm:0`` (PCI order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float | None
    quantization: str | None
    estimated_bytes: int
    memory: tuple[DeviceMemory, ...]
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()
    distributed_executor: str | None = None
    tensor_split: tuple[float, ...] = ()
    """llama.cpp layer split over ``devices`` (fractions), when more than one GPU."""
    swa_full: bool = True
    """llama.cpp: full-size KV cache for sliding-window layers; the KV estimate follows this flag."""
    n_ubatch: int = 512
    calibration_bytes: int = 0
    """Correction from measured loads already included in ``estimated_bytes`` (0: none applied)."""
    speculative: bool = False
    """llama.cpp: draft tokens by prompt lookup (n-gram) and verify them in the same decode."""
    flash_attn: str = "auto"
    """llama.cpp: flash attention ``auto`` (libllama decides per device), ``on`` (needed by a quantized KV cache) or ``off``."""
    decode_tps: float | None = None
    """Estimated decode tokens/s of one stream while ``parallel`` streams decode (see :mod:`.speed`)."""
    aggregate_tps: float | None = None
    """Estimated decode tokens/s of all ``parallel`` streams together."""
    prompt_tps: float | None = None
    """Estimated prompt (prefill) tokens/s."""
    speed_correction: float = 1.0
    """Measured-over-estimated factor already in the speeds (1.0: none)."""
    decode_curve: tuple[float, ...] = ()
    """The formula's own (uncorrected) decode tokens/s per stream at 1, 2, … streams: what a measured
    speed at that many streams is compared with (:func:`appliance.planner.calibration.record_decode_speed`)."""

    @property
    def calibrated(self) -> bool:
        return self.calibration_bytes != 0

    @property
    def raw_estimated_bytes(self) -> int:
        """The formula's estimate before calibration: what a new measurement is compared with."""
        return self.estimated_bytes - self.calibration_bytes

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> Plan:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["memory"] = tuple(DeviceMemory(**m) for m in values.get("memory", ()))
        values["rejected"] = tuple(tuple(r) for r in values.get("rejected", ()))
        for key in ("devices", "tensor_split", "decode_curve"):
            values[key] = tuple(values.get(key, ()))
        return cls(**values)


@dataclass(frozen=True)
class Refusal:
    """Nothing fits; says why and what would be needed."""

    model: str
    reason: str
    needed: tuple[str, ...] = ()
    """What would make it fit, one line each (``8.2 GiB of free RAM (have 5.1 GiB)``)."""
    rejected: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def to_error(self) -> DoesNotFit:
        detail = f"{self.reason}; needs {' or '.join(self.needed)}" if self.needed else self.reason
        return DoesNotFit(f"{self.model} does not fit: {detail}")


@dataclass(frozen=True)
class PlanRow:
    """One line of ``appliancectl plan``: a variant, whether it fits, how and why."""

    variant: str
    format: str
    quantization: str | None
    size_bytes: int
    fits: bool
    chosen: bool
    backend: str | None
    placement: str
    """``GPU0``, ``GPU0+GPU1``, ``20/32 layers on GPU0``, ``CPU``, ``TP=2``, or ``-``."""
    reason: str
    estimated_bytes: int
    memory: tuple[DeviceMemory, ...] = field(default=())
    decode_tps: float | None = None
    """Estimated decode tokens/s per stream at the planned parallelism (None: does not fit)."""
    prompt_tps: float | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)
