"""Pieces shared by the planner's backend modules: the attempt record, GPU filters, wording."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from appliance.hardware.snapshot import GpuInfo, HardwareSnapshot
from appliance.hardware.units import GiB, MiB
from appliance.planner.types import DeviceMemory, Preferences, Variant

TIER_VLLM, TIER_FULL_GPU, TIER_PARTIAL, TIER_CPU = 0, 1, 2, 3
LLAMACPP_MIN_CC = (5, 0)
VLLM_MIN_CC = (7, 0)


class PlanFields(TypedDict, total=False):
    """The :class:`~appliance.planner.types.Plan` fields an attempt decides (absent: the Plan default)."""

    context: int
    threads: int | None
    n_gpu_layers: int
    devices: tuple[str, ...]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float | None
    distributed_executor: str | None
    tensor_split: tuple[float, ...]
    swa_full: bool


@dataclass(frozen=True)
class Attempt:
    """One way to run one variant, and whether it fits."""

    variant: Variant
    backend: str
    tier: int
    fits: bool
    memory: tuple[DeviceMemory, ...]
    summary: str
    """Fits: how (``all 28 layers on GPU0, 1.3 GiB headroom``). Not: why (``needs 9.1 GiB > 7.8 GiB usable on GPU0``)."""
    placement: str
    context: int
    fields: PlanFields = field(default_factory=PlanFields)
    gpu_fraction: float = 0.0


def gib(n: float) -> str:
    """``9.1 GiB`` / ``512 MiB`` (one decimal from 1 GiB up)."""
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB else f"{n / MiB:.0f} MiB"


def ctx_text(n: int) -> str:
    """``16k`` for multiples of 1024, else the number."""
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def llamacpp_gpus(snapshot: HardwareSnapshot, prefs: Preferences) -> list[GpuInfo]:
    """GPUs a GPU build of llama.cpp can use: NVIDIA cc >= 5.0, AMD with ROCm."""
    if not prefs.llamacpp_gpu:
        return []
    out = []
    for g in snapshot.gpus:
        cc = g.cc_tuple
        if g.vendor == "nvidia" and (cc is None or cc >= LLAMACPP_MIN_CC) or g.vendor == "amd" and g.rocm:
            out.append(g)
    return out


def vllm_gpus(snapshot: HardwareSnapshot) -> list[GpuInfo]:
    """GPUs vLLM supports: NVIDIA compute capability >= 7.0, AMD with ROCm."""
    return [
        g
        for g in snapshot.gpus
        if (g.vendor == "nvidia" and (g.cc_tuple or (0, 0)) >= VLLM_MIN_CC) or (g.vendor == "amd" and g.rocm)
    ]


def gpu_groups(gpus: list[GpuInfo]) -> list[list[GpuInfo]]:
    """Placements to try, smallest first: the GPU with most free memory, then all whole GPUs of its vendor."""
    if not gpus:
        return []
    best = max(gpus, key=lambda g: (g.memory_free, -g.index))
    groups = [[best]]
    whole = [g for g in gpus if g.vendor == best.vendor and not g.mig_instance]
    if len(whole) > 1 and not best.mig_instance:
        groups.append(sorted(whole, key=lambda g: g.index))
    return groups


def labels(gpus: list[GpuInfo]) -> str:
    return "+".join(g.label for g in gpus)


def worst_row(memory: tuple[DeviceMemory, ...], margin: int) -> DeviceMemory | None:
    """The device that misses its margin by the most, or None when all fit."""
    short = [m for m in memory if m.headroom < margin]
    return min(short, key=lambda m: m.headroom - margin) if short else None


def shortfall(m: DeviceMemory, margin: int, name: str) -> str:
    """``needs 9.1 GiB > 7.8 GiB usable on GPU0`` (usable = free less the margin)."""
    return f"needs {gib(m.used)} > {gib(max(0, m.free - margin))} usable on {name}"
