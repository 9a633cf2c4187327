"""llama.cpp placements: every layer on GPU(s), a partial offload, or CPU only.

Pure functions of (variant, hardware, preferences); formulas in
:mod:`appliance.planner.estimates`.
"""

from __future__ import annotations

from appliance.hardware.snapshot import GpuInfo, HardwareSnapshot
from appliance.planner.common import (
    TIER_CPU,
    TIER_FULL_GPU,
    TIER_PARTIAL,
    Attempt,
    PlanFields,
    ctx_text,
    gib,
    labels,
    shortfall,
    worst_row,
)
from appliance.planner.estimates import (
    CPU_COMPUTE_BASE,
    GPU_RUNTIME_BYTES,
    N_UBATCH,
    WeightSplit,
    llamacpp_cpu_compute,
    llamacpp_gpu_compute,
    llamacpp_host_overhead,
    llamacpp_kv_bytes,
    split_weights,
)
from appliance.planner.quality import quantization_of
from appliance.planner.types import DeviceMemory, Preferences, Variant


def llamacpp_context(v: Variant, prefs: Preferences) -> tuple[int, str]:
    """Context of one request (slot): the wanted one, capped at the trained context.

    The engine's unified KV cache holds ``context x parallel`` cells (the driver
    creates the llama.cpp context with ``n_ctx = context x parallel``).
    """
    ctx = prefs.min_context
    trained = v.facts.context_length
    if trained and ctx > trained:
        return trained, f" (capped at the trained {ctx_text(trained)})"
    return ctx, ""


def llamacpp_flash_attn(kv_dtype: str) -> str:
    """``on`` for a quantized KV cache (libllama quantizes V only inside flash attention), else ``auto``."""
    return "auto" if kv_dtype.lower() in ("f16", "f32", "bf16") else "on"


class _Shape:
    """Per-variant numbers every llama.cpp placement needs."""

    def __init__(self, v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, extra: int = 0):
        self.v, self.f, self.prefs = v, v.facts, prefs
        self.ctx, self.ctx_note = llamacpp_context(v, prefs)
        self.kv_dtype = (
            prefs.kv_cache_dtype if prefs.kv_cache_dtype and prefs.kv_cache_dtype.lower() not in ("auto", "fp8") else "f16"
        )
        self.w: WeightSplit = split_weights(self.f, v.size_bytes)
        self.kv = llamacpp_kv_bytes(self.f, self.ctx, prefs.parallel, self.kv_dtype, prefs.swa_full)
        self.kv_layer = self.kv / self.f.n_layer
        self.threads = prefs.threads or snapshot.cpu.physical_cores or 1
        self.ram = snapshot.cpu.memory_available
        self.quant = quantization_of(v) or v.name
        self.host_overhead = max(0, llamacpp_host_overhead(self.f) + extra)

    def head(self) -> str:
        return f"{self.quant}, {ctx_text(self.ctx)} ctx{self.ctx_note}"

    def fields(self, n_gpu_layers: int, devices: tuple[str, ...], tensor_split: tuple[float, ...] = ()) -> PlanFields:
        return PlanFields(
            context=self.ctx,
            threads=self.threads,
            kv_cache_dtype=self.kv_dtype,
            swa_full=self.prefs.swa_full,
            n_gpu_layers=n_gpu_layers,
            devices=devices,
            tensor_split=tensor_split,
        )

    def host_row(self, layers_on_cpu: int, output_on_cpu: bool, full_offload: bool) -> DeviceMemory:
        f, w = self.f, self.w
        weights = w.embd + layers_on_cpu * w.layer + (w.output if output_on_cpu and not w.tied else 0)
        if full_offload:  # host keeps embeddings, logits and a small staging buffer
            compute = CPU_COMPUTE_BASE + N_UBATCH * 4 * f.n_embd + self.prefs.parallel * (f.n_vocab or 0) * 4
        else:
            compute = llamacpp_cpu_compute(f, self.prefs.parallel)
        return DeviceMemory.of("cpu", int(weights), int(layers_on_cpu * self.kv_layer), compute, self.host_overhead, self.ram)


def _label(device: str, gpus: list[GpuInfo]) -> str:
    return next((g.label for g in gpus if g.device_id == device), "RAM")


def _fail(s: _Shape, tier: int, memory: tuple[DeviceMemory, ...], gpus: list[GpuInfo], placement: str) -> Attempt:
    bad = worst_row(memory, s.prefs.memory_margin)
    why = shortfall(bad, s.prefs.memory_margin, _label(bad.device, gpus)) if bad else "does not fit"
    return Attempt(s.v, "llamacpp", tier, False, memory, why, placement, s.ctx)


def _split_layers(capacity: list[int], n_layer: int) -> list[int]:
    """Spread ``n_layer`` over GPUs in proportion to their capacity, never past it."""
    total = sum(capacity)
    if total < n_layer:
        raise ValueError("capacity below the layer count")
    layers = [min(c, n_layer * c // total) for c in capacity]
    while sum(layers) < n_layer:  # hand out the remainder, first GPUs first
        i = next(k for k, c in enumerate(capacity) if layers[k] < c)
        layers[i] += 1
    return layers


def _even(n_layer: int, parts: int) -> list[int]:
    return [n_layer // parts + (1 if i < n_layer % parts else 0) for i in range(parts)]


def full_gpu(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, gpus: list[GpuInfo], extra: int = 0) -> Attempt:
    """Every block and the output head on ``gpus`` (split by layer, output on the last).

    ``extra``: calibration correction in bytes, spread over the GPUs' overhead.
    """
    s = _Shape(v, snapshot, prefs)
    runtime = max(0, GPU_RUNTIME_BYTES + extra // len(gpus))
    f, w, margin = s.f, s.w, prefs.memory_margin
    per_layer = w.layer + s.kv_layer
    capacity = []
    for i, g in enumerate(gpus):
        last = i == len(gpus) - 1
        room = g.memory_free - margin - runtime - llamacpp_gpu_compute(f, last) - (w.output if last else 0)
        capacity.append(max(0, int(room // per_layer)))
    host = s.host_row(0, False, True)
    if sum(capacity) < f.n_layer or (len(gpus) > 1 and min(capacity) == 0):
        layers = _even(f.n_layer, len(gpus))
    else:
        layers = _split_layers(capacity, f.n_layer)
    rows = []
    for i, (g, n) in enumerate(zip(gpus, layers, strict=True)):
        last = i == len(gpus) - 1
        rows.append(
            DeviceMemory.of(
                g.device_id,
                int(n * w.layer + (w.output if last else 0)),
                int(n * s.kv_layer),
                llamacpp_gpu_compute(f, last),
                runtime,
                g.memory_free,
            )
        )
    memory = (*rows, host)
    where = labels(gpus)
    if any(m.headroom < margin for m in memory):
        return _fail(s, TIER_FULL_GPU, memory, gpus, where)
    spare = min(r.headroom for r in rows)
    split = f" ({'/'.join(map(str, layers))})" if len(gpus) > 1 else ""
    summary = f"{s.head()}, all {f.n_layer} layers on {where}{split}, {gib(spare)} headroom"
    fractions = tuple(round(n / f.n_layer, 4) for n in layers) if len(gpus) > 1 else ()
    return Attempt(
        v,
        "llamacpp",
        TIER_FULL_GPU,
        True,
        memory,
        summary,
        where,
        s.ctx,
        s.fields(-1, tuple(g.device_id for g in gpus), fractions),
        1.0,
    )


def partial(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, gpus: list[GpuInfo], extra: int = 0) -> Attempt:
    """As many blocks as fit on ``gpus``; the rest, embeddings and output head on the CPU.

    ``extra``: calibration correction in bytes, added to the host's overhead.
    """
    s = _Shape(v, snapshot, prefs, extra)
    f, w, margin = s.f, s.w, prefs.memory_margin
    per_layer = w.layer + s.kv_layer
    capacity = []
    for g in gpus:
        room = g.memory_free - margin - GPU_RUNTIME_BYTES - llamacpp_gpu_compute(f, False)
        capacity.append(max(0, int(room // per_layer)))
    on_gpu = min(f.n_layer, sum(capacity))
    where = labels(gpus)
    if on_gpu == 0:
        rows = tuple(
            DeviceMemory.of(
                g.device_id, int(w.layer), int(s.kv_layer), llamacpp_gpu_compute(f, False), GPU_RUNTIME_BYTES, g.memory_free
            )
            for g in gpus
        )
        bad = min(rows, key=lambda m: m.headroom)
        why = f"not even one layer fits: {shortfall(bad, margin, _label(bad.device, gpus))}"
        return Attempt(v, "llamacpp", TIER_PARTIAL, False, rows, why, where, s.ctx)
    layers = _split_layers([c for c in capacity], on_gpu) if len(gpus) > 1 else [on_gpu]
    rows = tuple(
        DeviceMemory.of(
            g.device_id, int(n * w.layer), int(n * s.kv_layer), llamacpp_gpu_compute(f, False), GPU_RUNTIME_BYTES, g.memory_free
        )
        for g, n in zip(gpus, layers, strict=True)
        if n > 0
    )
    used_gpus = [g for g, n in zip(gpus, layers, strict=True) if n > 0]
    host = s.host_row(f.n_layer - on_gpu, True, False)
    memory = (*rows, host)
    placement = f"{on_gpu}/{f.n_layer} layers on {labels(used_gpus)}"
    if any(m.headroom < margin for m in memory):
        return _fail(s, TIER_PARTIAL, memory, gpus, placement)
    spare = min(r.headroom for r in rows)
    summary = (
        f"{s.head()}, {placement}, {f.n_layer - on_gpu} on CPU ({s.threads} threads), "
        f"{gib(spare)} GPU headroom, {gib(host.headroom)} RAM headroom"
    )
    fractions = tuple(round(n / on_gpu, 4) for n in layers if n > 0) if len(used_gpus) > 1 else ()
    return Attempt(
        v,
        "llamacpp",
        TIER_PARTIAL,
        True,
        memory,
        summary,
        placement,
        s.ctx,
        s.fields(on_gpu, tuple(g.device_id for g in used_gpus), fractions),
        on_gpu / f.n_layer,
    )


def cpu_only(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, extra: int = 0) -> Attempt:
    """Everything in RAM. ``extra``: calibration correction in bytes."""
    s = _Shape(v, snapshot, prefs, extra)
    f = s.f
    row = DeviceMemory.of("cpu", s.w.total, s.kv, llamacpp_cpu_compute(f, prefs.parallel), s.host_overhead, s.ram)
    if row.headroom < prefs.memory_margin:
        return _fail(s, TIER_CPU, (row,), [], "CPU")
    summary = f"{s.head()}, CPU with {s.threads} threads, {gib(row.headroom)} RAM headroom"
    return Attempt(v, "llamacpp", TIER_CPU, True, (row,), summary, "CPU", s.ctx, s.fields(0, ("cpu",)))
