"""Where the llama.cpp worker runs: the GPUs it sees, how the layers split, its KV cache and attention.

Pure functions of the plan (argument builders, as GPUStack's backends have them): the
environment that makes exactly the plan's devices visible, renumbered from 0, and the
worker flags that place the model on them. The worker applies the flags to libllama's
model and context parameters (:mod:`.model`, :mod:`.context`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: KV cache element types the worker accepts (ggml type names). Quantized ones need flash attention.
KV_CACHE_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN_MODES = ("auto", "on", "off")
#: CUDA and HIP stop listing devices at the first invalid id: this one hides them all.
NO_DEVICE = "-1"


def is_quantized_kv(kv_type: str) -> bool:
    return kv_type.lower() not in ("f32", "f16")


@dataclass(frozen=True)
class Placement:
    """The plan's placement, reduced to what the worker process needs."""

    env: dict[str, str]
    """Device visibility for the worker's environment."""
    args: list[str]
    """Worker flags: split mode, main GPU, tensor split, KV cache type, flash attention, SWA cache."""


def _ids(devices: Sequence[str], prefix: str) -> list[str]:
    """``cuda:1`` → ``1``; ``cuda:MIG-…`` → ``MIG-…`` (CUDA takes MIG UUIDs in the same list)."""
    return [d.split(":", 1)[1] for d in devices if d.startswith(prefix + ":")]


def device_environment(devices: Sequence[str]) -> dict[str, str]:
    """Show the worker the plan's GPUs only, in the plan's order, so it numbers them from 0.

    The planner numbers NVIDIA GPUs in PCI order (NVML's), so CUDA is told to as well. A
    CPU plan hides every GPU: a GPU build of libllama would otherwise still put its compute
    buffers and large prompt batches on GPU 0, memory the plan never counted.
    """
    cuda, rocm = _ids(devices, "cuda"), _ids(devices, "rocm")
    if cuda:
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(cuda), "HIP_VISIBLE_DEVICES": NO_DEVICE}
    if rocm:
        return {"HIP_VISIBLE_DEVICES": ",".join(rocm), "CUDA_VISIBLE_DEVICES": NO_DEVICE}
    return {"CUDA_VISIBLE_DEVICES": NO_DEVICE, "HIP_VISIBLE_DEVICES": NO_DEVICE}


def flash_attn_mode(kv_type: str, requested: str = "auto") -> str:
    """``on`` whenever the V cache is quantized (libllama refuses it otherwise), else ``requested``."""
    return "on" if is_quantized_kv(kv_type) else requested


def placement_args(
    *,
    devices: Sequence[str],
    n_gpu_layers: int,
    tensor_split: Sequence[float] = (),
    kv_type: str = "f16",
    flash_attn: str = "auto",
    swa_full: bool = True,
) -> list[str]:
    """Worker flags for the placement. GPU indices are the renumbered ones (the first visible GPU is 0)."""
    gpus = [d for d in devices if d != "cpu"]
    args: list[str] = []
    if gpus and n_gpu_layers != 0:
        if len(gpus) > 1:
            split = list(tensor_split) or [1.0] * len(gpus)
            if len(split) != len(gpus):
                raise ValueError(f"tensor_split has {len(split)} parts for {len(gpus)} devices")
            args += ["--split-mode", "layer", "--tensor-split", ",".join(f"{x:g}" for x in split)]
        else:
            args += ["--split-mode", "none"]
        args += ["--main-gpu", "0"]
    kv = kv_type.lower()
    if kv not in KV_CACHE_TYPES:
        raise ValueError(f"unknown KV cache type {kv_type!r} ({', '.join(KV_CACHE_TYPES)})")
    args += ["--kv-type", kv, "--flash-attn", flash_attn_mode(kv, flash_attn)]
    if not swa_full:
        args.append("--no-swa-full")
    return args


def placement_of(
    devices: Sequence[str],
    n_gpu_layers: int,
    tensor_split: Sequence[float] = (),
    kv_type: str = "f16",
    flash_attn: str = "auto",
    swa_full: bool = True,
) -> Placement:
    """Environment and flags together, for a plan's fields."""
    return Placement(
        device_environment(devices),
        placement_args(
            devices=devices,
            n_gpu_layers=n_gpu_layers,
            tensor_split=tensor_split,
            kv_type=kv_type,
            flash_attn=flash_attn,
            swa_full=swa_full,
        ),
    )
