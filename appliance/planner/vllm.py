"""vLLM placements: tensor parallel on local GPUs, Ray across nodes, or the CPU backend.

``gpu_memory_utilization`` is computed, never defaulted: vLLM reserves that
fraction of each GPU's *total* memory (on the CPU backend, of the NUMA node's RAM)
and gives whatever its weights and activations leave to the KV cache, so the
fraction is what the plan needs, rounded up to 0.01, and must fit in free memory.
"""

from __future__ import annotations

import math

from appliance.hardware.snapshot import GpuInfo, HardwareSnapshot
from appliance.planner.common import TIER_CPU, TIER_VLLM, Attempt, PlanFields, ctx_text, gib, shortfall, vllm_gpus
from appliance.planner.estimates import VLLM_CPU_OVERHEAD, VLLM_GPU_OVERHEAD, vllm_compute, vllm_kv_bytes, weight_bytes
from appliance.planner.quality import quantization_of
from appliance.planner.types import DeviceMemory, Preferences, Variant

TP_SIZES = (1, 2, 4, 8)
MIN_CC = {"FP8": (8, 0), "AWQ": (7, 5), "COMPRESSED-TENSORS": (7, 5)}
"""Compute capability vLLM's kernels need per quantization (FP8 through Marlin on Ampere)."""
VLLM_KV_TYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def vllm_context(v: Variant, prefs: Preferences) -> tuple[int, str]:
    """Per-sequence context (max_model_len): the wanted one, capped at the trained context."""
    trained = v.facts.context_length
    if trained and prefs.min_context > trained:
        return trained, f" (capped at the trained {ctx_text(trained)})"
    return prefs.min_context, ""


def _kv_dtype(prefs: Preferences) -> str:
    d = (prefs.kv_cache_dtype or "auto").lower()
    return d if d in VLLM_KV_TYPES else "auto"


def capability_problem(v: Variant, gpus: list[GpuInfo]) -> str | None:
    """Why these GPUs cannot run this variant's quantization, or None."""
    need = MIN_CC.get(quantization_of(v))
    for g in gpus:
        cc = g.cc_tuple
        if need and cc is not None and cc < need:
            return f"{quantization_of(v)} needs compute capability {need[0]}.{need[1]}, {g.label} has {g.compute_capability}"
    return None


def _rows(
    v: Variant, gpus: list[tuple[str, GpuInfo]], tp: int, pp: int, context: int, prefs: Preferences, extra: int
) -> tuple[tuple[DeviceMemory, ...], float]:
    f = v.facts
    overhead = max(0, VLLM_GPU_OVERHEAD + extra // len(gpus))
    weights = weight_bytes(f, v.size_bytes) / (tp * pp)
    kv = vllm_kv_bytes(f, context, prefs.parallel, _kv_dtype(prefs)) / (min(tp, max(1, f.n_head_kv)) * pp)
    compute = vllm_compute(f, tp)
    util = 0.0
    for _, g in gpus:
        util = max(util, math.ceil((weights + kv + compute + overhead) / g.memory_total * 100) / 100)
    util = min(util, 1.0)
    rows = []
    for name, g in gpus:
        reserved = util * g.memory_total  # vLLM hands everything reserved beyond weights/activations to the KV cache
        rows.append(
            DeviceMemory.of(
                name, int(weights), int(max(kv, reserved - weights - compute - overhead)), compute, overhead, g.memory_free
            )
        )
    return tuple(rows), util


def _pick(gpus: list[GpuInfo], n: int) -> list[GpuInfo]:
    """The ``n`` GPUs with most free memory, in index order."""
    return sorted(sorted(gpus, key=lambda g: (-g.memory_free, g.index))[:n], key=lambda g: g.index)


def _attempt(
    v: Variant,
    prefs: Preferences,
    context: int,
    note: str,
    chosen: list[tuple[str, GpuInfo]],
    tp: int,
    pp: int,
    label: str,
    extra: int,
) -> Attempt:
    rows, util = _rows(v, chosen, tp, pp, context, prefs, extra)
    margin = prefs.memory_margin
    tight = min(rows, key=lambda m: m.headroom)
    head = f"{quantization_of(v) or v.name}, {ctx_text(context)} ctx{note} x {prefs.parallel} seq"
    if tight.headroom < margin:
        names = {n: g.label for n, g in chosen}
        return Attempt(
            v, "vllm", TIER_VLLM, False, rows, shortfall(tight, margin, names.get(tight.device, tight.device)), label, context
        )
    summary = f"{head}, vLLM {label}, gpu_memory_utilization {util:.2f}, {gib(tight.headroom)} headroom"
    fields: PlanFields = {
        "context": context,
        "threads": None,
        "n_gpu_layers": -1,
        "devices": tuple(n for n, _ in chosen),
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "kv_cache_dtype": _kv_dtype(prefs),
        "gpu_memory_utilization": util,
        "distributed_executor": "ray" if pp > 1 else None,
    }
    return Attempt(v, "vllm", TIER_VLLM, True, rows, summary, label, context, fields, 1.0)


def vllm_gpu(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, extra: int = 0) -> Attempt | None:
    """Smallest tensor-parallel size that fits locally; else pipeline stages over Ray nodes.

    None when the box has no GPU vLLM supports. ``extra``: calibration correction in bytes.
    """
    gpus = vllm_gpus(snapshot)
    if not gpus:
        return None
    context, note = vllm_context(v, prefs)
    problem = capability_problem(v, gpus)
    if problem:
        return Attempt(v, "vllm", TIER_VLLM, False, (), problem, "-", context)
    whole = [g for g in gpus if not g.mig_instance]
    last: Attempt | None = None
    for tp in TP_SIZES:
        pool = gpus if tp == 1 else whole
        if tp > len(pool) or v.facts.n_head % tp:
            continue
        chosen = _pick(pool, tp)
        label = f"TP={tp} on {'+'.join(g.label for g in chosen)}" if tp > 1 else f"on {chosen[0].label}"
        last = _attempt(v, prefs, context, note, [(g.device_id, g) for g in chosen], tp, 1, label, extra)
        if last.fits:
            return last
    if prefs.ray_address and prefs.cluster:
        ray = _ray(v, snapshot, prefs, context, note, extra)
        if ray is not None and (ray.fits or last is None):
            return ray
    return last


def _ray(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, context: int, note: str, extra: int) -> Attempt | None:
    """Tensor parallel within each node, one pipeline stage per node (Ray executor)."""
    # Pipeline stages on this box first, then on each node whose GPUs vLLM can use for this variant.
    nodes = [snapshot, *(n for n in prefs.cluster if vllm_gpus(n) and capability_problem(v, vllm_gpus(n)) is None)]
    per_node = [[g for g in vllm_gpus(n) if not g.mig_instance] for n in nodes]
    last = None
    for pp in range(2, len(nodes) + 1):
        count = min(len(p) for p in per_node[:pp])
        tps = [t for t in TP_SIZES if t <= count and v.facts.n_head % t == 0]
        if not tps:
            return last
        tp = tps[-1]
        chosen = [
            (f"{node.hostname}/{g.device_id}", g)
            for node, pool in zip(nodes[:pp], per_node[:pp], strict=True)
            for g in _pick(pool, tp)
        ]
        last = _attempt(v, prefs, context, note, chosen, tp, pp, f"TP={tp} x PP={pp} over {pp} nodes (Ray)", extra)
        if last.fits:
            return last
    return last


def vllm_cpu(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, extra: int = 0) -> Attempt:
    """vLLM's CPU backend: its gpu_memory_utilization is a fraction of the NUMA node's RAM."""
    f, cpu = v.facts, snapshot.cpu
    context, note = vllm_context(v, prefs)
    if f.head_dim < 32:
        return Attempt(
            v, "vllm", TIER_CPU, False, (), f"vLLM's CPU attention does not support head_dim {f.head_dim}", "CPU", context
        )
    node_total = cpu.memory_total // max(1, cpu.numa_nodes)
    weights = weight_bytes(f, v.size_bytes)
    kv = vllm_kv_bytes(f, context, prefs.parallel, _kv_dtype(prefs))
    compute = vllm_compute(f, 1)
    overhead = max(0, VLLM_CPU_OVERHEAD + extra)
    util = math.ceil((weights + kv + compute + overhead) / node_total * 100) / 100
    kv_given = max(kv, int(util * node_total) - weights - compute - overhead)
    row = DeviceMemory.of("cpu", weights, kv_given, compute, overhead, min(cpu.memory_available, node_total))
    if row.headroom < prefs.memory_margin or util > 1:
        return Attempt(v, "vllm", TIER_CPU, False, (row,), shortfall(row, prefs.memory_margin, "RAM"), "CPU", context)
    summary = (
        f"{quantization_of(v) or v.name}, {ctx_text(context)} ctx{note} x {prefs.parallel} seq, vLLM on CPU, "
        f"gpu_memory_utilization {util:.2f} of the NUMA node's RAM, {gib(row.headroom)} headroom"
    )
    fields: PlanFields = {
        "context": context,
        "threads": prefs.threads or cpu.physical_cores,
        "n_gpu_layers": 0,
        "devices": ("cpu",),
        "kv_cache_dtype": _kv_dtype(prefs),
        "gpu_memory_utilization": util,
    }
    return Attempt(v, "vllm", TIER_CPU, True, (row,), summary, "CPU", context, fields)
