"""How fast a placement will decode and read prompts: a roofline of memory bandwidth and compute. Pure.

Decoding one step reads every offloaded weight once and, per stream, the KV cache written so
far; it also does ~2 FLOPs per active parameter per stream. A GPU overlaps the two: it takes
``max(bytes / bandwidth, flops / compute) + per-layer overhead``. CPU cores do not: the same
threads dequantize, multiply and wait for memory, op after op with a barrier between them, so a
CPU takes ``bytes / bandwidth + flops / compute``. llama.cpp's layers run one device after the
other, vLLM's tensor-parallel ranks side by side. A stream
then decodes ``1 / step`` tokens/s, all streams ``streams / step``. Prompts are compute-bound:
``1 / Σ flops / compute`` tokens/s.

The figures are estimates; measured loads correct them (:func:`speed_correction`). The
constants below say where they come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from appliance.hardware.snapshot import CpuInfo, GpuInfo, HardwareSnapshot
from appliance.modelfacts import ModelFacts
from appliance.planner.common import Attempt
from appliance.planner.estimates import ffn_width, kv_per_cell_layer, split_weights
from appliance.planner.types import CalibrationPoint, Preferences

GB = 1e9
TFLOPS = 1e12

#: (name fragment, memory bandwidth GB/s, dense FP16 tensor TFLOP/s) from the vendors' data sheets;
#: the first fragment found in the GPU's name (lower case) wins, so specific names come first.
GPU_SPECS: tuple[tuple[str, float, float], ...] = (
    ("gh200", 4000, 989),
    ("h200", 4800, 989),
    ("h100 nvl", 3900, 835),
    ("h100 pcie", 2000, 756),
    ("h100", 3350, 989),
    ("h800", 3350, 989),
    ("b200", 8000, 2250),
    ("a100-pcie-40gb", 1555, 312),
    ("a100-sxm4-40gb", 1555, 312),
    ("a100", 2039, 312),
    ("a800", 2039, 312),
    ("l40s", 864, 362),
    ("l40", 864, 181),
    ("l4", 300, 121),
    ("a10g", 600, 70),
    ("a10", 600, 125),
    ("a30", 933, 165),
    ("a16", 200, 36),
    ("a2", 200, 18),
    ("t4", 320, 65),
    ("v100", 900, 125),
    ("p100", 732, 19),
    ("p40", 346, 12),
    ("rtx 5090", 1792, 209),
    ("rtx 5080", 960, 113),
    ("rtx 4090", 1008, 165),
    ("rtx 4080", 717, 97),
    ("rtx 4070", 504, 58),
    ("rtx 4060", 272, 30),
    ("rtx 3090", 936, 71),
    ("rtx 3080", 760, 60),
    ("rtx 3070", 448, 41),
    ("rtx 3060", 360, 25),
    ("rtx 6000 ada", 960, 182),
    ("rtx a6000", 768, 77),
    ("rtx a5000", 768, 56),
    ("rtx a4000", 448, 38),
    ("mi355x", 8000, 2300),
    ("mi325x", 6000, 1307),
    ("mi300x", 5300, 1307),
    ("mi300a", 5300, 980),
    ("mi250x", 3277, 383),
    ("mi250", 3277, 362),
    ("mi210", 1638, 181),
    ("mi100", 1229, 184),
    ("7900 xtx", 960, 123),
    ("7900 xt", 800, 103),
    ("w7900", 864, 122),
)
UNKNOWN_GPU = (300.0, 30.0)
"""An unlisted GPU is assumed as slow as an L4-class card, so the floor is never met by guesswork."""
GPU_BANDWIDTH_EFFICIENCY = 0.8
"""Share of the data-sheet bandwidth decode kernels reach (llama.cpp and vLLM on large models)."""
GPU_COMPUTE_EFFICIENCY = 0.5
"""Share of dense FP16 tensor throughput quantized matmuls reach."""
GPU_LAYER_OVERHEAD_S = {"llamacpp": 50e-6, "vllm": 20e-6}
"""Kernel launches and synchronisation per layer and step: llama.cpp decodes a 7B Q4_0 at ~160 tok/s on
an RTX 4090 and ~180 on an H100 PCIe, which bandwidth alone would put at ~200 and ~440; vLLM's CUDA
graphs cut it."""
CPU_BANDWIDTH_PER_CORE = 15 * GB
"""Memory read rate one core's decode threads reach, fitted with :data:`CPU_FLOPS_PER_CORE` to the
default model's quantization ladder on 2 cores of the reference box (``tests/bench/bench_quantize.py
--model gemma``: F16, 543 MB, decodes at 42 tok/s and Q2_K, 237 MB, at 67; one stream each)."""
CPU_BANDWIDTH_PER_NUMA_NODE = 150 * GB
"""Ceiling per socket: ~1/3 of a 12-channel DDR5 socket's 460 GB/s, as llama.cpp reaches it across NUMA."""
CPU_FLOPS_PER_CORE = {"avx512": 50e9, "avx2": 30e9, "other": 10e9}
"""Quantized dot products per core: ~0.54 GFLOP per token of Gemma 3 270M. With the read time added,
8 streams of its Q4_K_M on 2 AVX-512 cores of the reference box come out at ~155 tok/s in all; llama.cpp's
server measured 150 there, the raw decode loop 189."""
KV_FILL = 0.5
"""The average stream is half way through its context when it decodes."""


@dataclass(frozen=True)
class Speed:
    """Estimated speed of one placement at ``streams`` concurrent streams (tokens/s)."""

    decode_tps: float
    """One stream's decode rate while ``streams`` decode together."""
    aggregate_tps: float
    prompt_tps: float
    streams: int
    bound: str
    """What limits decode on the slowest device: ``memory bandwidth`` or ``compute``."""
    correction: float = 1.0
    """Factor from measured loads already applied (1.0: none)."""


@dataclass(frozen=True)
class _Device:
    bandwidth: float
    flops: float
    overhead_s: float
    overlaps: bool = True
    """Memory reads hide behind compute (a GPU) or add to it (CPU cores)."""


def gpu_spec(gpu: GpuInfo) -> tuple[float, float]:
    """(bandwidth GB/s, TFLOP/s) of the GPU from :data:`GPU_SPECS` (an unknown one: :data:`UNKNOWN_GPU`)."""
    name = gpu.name.lower()
    return next(((bw, tf) for frag, bw, tf in GPU_SPECS if frag in name), UNKNOWN_GPU)


def cpu_bandwidth(cpu: CpuInfo, threads: int) -> float:
    """Bytes/s the decode threads read: the snapshot's measured figure, else per core up to the sockets' ceiling."""
    if cpu.memory_bandwidth:
        return float(cpu.memory_bandwidth)
    cores = max(1, min(threads, cpu.physical_cores or threads))
    return min(cores * CPU_BANDWIDTH_PER_CORE, max(1, cpu.numa_nodes) * CPU_BANDWIDTH_PER_NUMA_NODE)


def cpu_flops(cpu: CpuInfo, threads: int) -> float:
    cores = max(1, min(threads, cpu.physical_cores or threads))
    kind = "avx512" if cpu.avx512 else "avx2" if cpu.avx2 else "other"
    return cores * CPU_FLOPS_PER_CORE[kind]


def active_params(f: ModelFacts) -> float:
    """Parameters one token passes through: attention, the active experts' FFN, and the output head."""
    attn = f.n_embd * f.head_dim * (2 * f.n_head) + f.n_embd * f.n_head_kv * f.kv_head_dims
    ffn = 3 * f.n_embd * ffn_width(f)
    return f.n_layer * (attn + ffn) + (f.n_vocab or 0) * f.n_embd


def flops_per_token(f: ModelFacts, context: int) -> float:
    """Matmuls (2 per active parameter) plus attention over the filled context (QK and AV)."""
    fill = context * KV_FILL
    return 2 * active_params(f) + 4 * f.n_layer * f.n_head * f.head_dim * fill


def _moe_active_share(f: ModelFacts) -> float:
    """Share of a layer's bytes one token reads: all of it, or the used experts' part of a mixture."""
    if not f.n_expert or not f.n_expert_used or f.n_expert <= f.n_expert_used:
        return 1.0
    n_ff = f.n_ff or 4 * f.n_embd
    ffn_all = 3 * f.n_embd * n_ff * f.n_expert
    attn = f.n_embd * f.head_dim * (2 * f.n_head) + f.n_embd * f.n_head_kv * f.kv_head_dims
    return (attn + ffn_all * f.n_expert_used / f.n_expert) / (attn + ffn_all)


def kv_read_per_token(f: ModelFacts, context: int, kv_dtype: str) -> float:
    """KV bytes one stream reads per decoded token, over all layers, at the average fill."""
    fill = context * KV_FILL
    window = f.sliding_window or 0
    swa = min(f.swa_layers, f.n_layer) if window else 0
    return kv_per_cell_layer(f, kv_dtype) * ((f.n_layer - swa) * fill + swa * min(fill, window))


def _device(device_id: str, snapshot: HardwareSnapshot, prefs: Preferences, threads: int, backend: str) -> _Device:
    if device_id == "cpu":
        return _Device(cpu_bandwidth(snapshot.cpu, threads), cpu_flops(snapshot.cpu, threads), 0.0, overlaps=False)
    host, _, local = device_id.rpartition("/")
    nodes = [snapshot, *prefs.cluster]
    pool = [g for n in nodes if not host or n.hostname == host for g in n.gpus]
    gpu = next((g for g in pool if g.device_id == local), None)
    bw, tf = gpu_spec(gpu) if gpu is not None else UNKNOWN_GPU
    return _Device(bw * GB * GPU_BANDWIDTH_EFFICIENCY, tf * TFLOPS * GPU_COMPUTE_EFFICIENCY, GPU_LAYER_OVERHEAD_S[backend])


def estimate_speed(
    a: Attempt, snapshot: HardwareSnapshot, prefs: Preferences, correction: float = 1.0, streams: int | None = None
) -> Speed | None:
    """Decode and prompt tokens/s of a fitting attempt at ``streams`` (default ``prefs.parallel``) streams;
    None without a placement."""
    if not a.memory:
        return None
    v, f = a.variant, a.variant.facts
    streams = max(1, streams or prefs.parallel)
    threads = a.fields.get("threads") or prefs.threads or snapshot.cpu.physical_cores or 1
    kv_dtype = a.fields.get("kv_cache_dtype", "f16")
    w = split_weights(f, v.size_bytes)
    share = _moe_active_share(f)
    output_on_cpu = a.backend == "llamacpp" and a.fields.get("n_gpu_layers", 0) != -1
    # Bytes each device reads per step: its weights (experts: the used share), less the token
    # embeddings kept in host memory (a lookup of one row), unless they double as the output head there.
    gpu_rows = [m.device for m in a.memory if m.device != "cpu"]
    head = "cpu" if output_on_cpu or not gpu_rows else gpu_rows[-1]  # where llama.cpp keeps the output head
    reads: list[tuple[str, float]] = []
    for m in a.memory:
        weights = float(m.weights)
        if a.backend == "vllm":
            nonlayer = w.output / len(a.memory)  # every rank holds its share of everything
        else:
            if m.device == "cpu" and not (w.tied and output_on_cpu):
                weights -= w.embd
            nonlayer = w.output if m.device == head else 0.0
        layers = max(0.0, weights - nonlayer)
        reads.append((m.device, weights - layers * (1 - share)))
    total_read = sum(r for _, r in reads) or 1.0
    kv_token = kv_read_per_token(f, a.context, kv_dtype)
    flops = flops_per_token(f, a.context)
    pp = max(1, a.fields.get("pipeline_parallel_size", 1))
    devices = {dev: _device(dev, snapshot, prefs, threads, a.backend) for dev, _ in reads}

    def device_time(device: str, read: float) -> tuple[float, str]:
        d, part = devices[device], read / total_read
        mem = (read + streams * kv_token * part) / d.bandwidth
        comp = streams * flops * part / d.flops
        layers = f.n_layer / pp if a.backend == "vllm" else f.n_layer * part
        busy = max(mem, comp) if d.overlaps else mem + comp
        return busy + d.overhead_s * layers, "memory bandwidth" if mem >= comp else "compute"

    timed = [device_time(dev, read) for dev, read in reads]
    slowest = max(timed, key=lambda t: t[0])
    # llama.cpp's layers pass the devices one after the other; vLLM's tensor-parallel ranks work
    # side by side and its pipeline stages in turn.
    t = slowest[0] * pp if a.backend == "vllm" else sum(x for x, _ in timed)
    prompt_s = sum(flops * (read / total_read) / devices[dev].flops for dev, read in reads)
    if a.backend == "vllm":
        prompt_s = max(flops * (read / total_read) / devices[dev].flops for dev, read in reads) * pp
    return Speed(
        decode_tps=correction / t,
        aggregate_tps=correction * streams / t,
        prompt_tps=correction / prompt_s if prompt_s else 0.0,
        streams=streams,
        bound=slowest[1],
        correction=correction,
    )


def decode_curve(a: Attempt, snapshot: HardwareSnapshot, prefs: Preferences, most: int = 64) -> tuple[float, ...]:
    """Uncorrected decode tokens/s per stream at 1, 2, … ``min(parallel, most)`` streams (what a
    measurement at any load is compared with)."""
    out = []
    for n in range(1, min(max(1, prefs.parallel), most) + 1):
        s = estimate_speed(a, snapshot, prefs, 1.0, n)
        if s is None:
            return ()
        out.append(round(s.decode_tps, 3))
    return tuple(out)


def speed_correction(variant_key: str, backend: str, points: Sequence[CalibrationPoint]) -> float:
    """Measured over estimated decode speed: this variant's own measurement, else the median of the backend's."""
    measured = [
        (p.variant_key, got / estimated)
        for p in points
        if p.backend == backend and (got := p.measured_decode_tps) and (estimated := p.estimated_decode_tps)
    ]
    own = [ratio for key, ratio in measured if key == variant_key]
    ratios = sorted(own or [ratio for _, ratio in measured])
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def speed_text(s: Speed) -> str:
    """``~12 tok/s per stream at 8 streams (96 in all), ~400 prompt tok/s``."""
    at = f" per stream at {s.streams} streams ({s.aggregate_tps:.0f} in all)" if s.streams > 1 else ""
    cal = " (calibrated)" if s.correction != 1.0 else ""
    return f"~{_tps(s.decode_tps)} tok/s{at}, ~{_tps(s.prompt_tps)} prompt tok/s{cal}"


def _tps(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"
