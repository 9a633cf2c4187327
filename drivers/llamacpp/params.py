"""libllama's model and context parameters for a placement: GPU split, KV cache type, flash attention.

The worker's flags (:func:`.worker.parse_args`) become these two small values; :mod:`.model`
applies :class:`GpuPlacement` to ``llama_model_params`` and :mod:`.context` applies
:class:`KvSettings` to ``llama_context_params`` (names as llama-cpp-python 0.3.36 spells them).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp.llama_cpp as ll

SPLIT_MODES = ("none", "layer", "row")
_SPLIT = {"none": ll.LLAMA_SPLIT_MODE_NONE, "layer": ll.LLAMA_SPLIT_MODE_LAYER, "row": ll.LLAMA_SPLIT_MODE_ROW}
_FLASH = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}
_GGML_TYPES = {
    "f32": ll.GGML_TYPE_F32,
    "f16": ll.GGML_TYPE_F16,
    "q8_0": ll.GGML_TYPE_Q8_0,
    "q4_0": ll.GGML_TYPE_Q4_0,
    "q4_1": ll.GGML_TYPE_Q4_1,
    "iq4_nl": ll.GGML_TYPE_IQ4_NL,
    "q5_0": ll.GGML_TYPE_Q5_0,
    "q5_1": ll.GGML_TYPE_Q5_1,
}


@dataclass(frozen=True)
class GpuPlacement:
    """How the weights spread over the visible GPUs (numbered from 0 by the worker's environment)."""

    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()

    def apply(self, params: ll.llama_model_params) -> ctypes.Array[ctypes.c_float] | None:
        """Set the split fields of ``params``; returns the split array, which must outlive the load."""
        params.split_mode = _SPLIT[self.split_mode]
        params.main_gpu = self.main_gpu
        if not self.tensor_split:
            return None
        slots = ll.llama_max_devices()
        if len(self.tensor_split) > slots:
            raise ValueError(f"--tensor-split has {len(self.tensor_split)} parts; this build handles {slots} devices")
        array = (ctypes.c_float * slots)(*self.tensor_split)
        params.tensor_split = ctypes.cast(array, ctypes.POINTER(ctypes.c_float))  # type: ignore[assignment]  # llama_cpp types the pointer field as an array
        return array


@dataclass(frozen=True)
class KvSettings:
    """The KV cache's element type (K and V alike), the attention kernel, and the sliding-window cache size."""

    kv_type: str = "f16"
    flash_attn: str = "auto"
    swa_full: bool = True

    def apply(self, params: ll.llama_context_params) -> None:
        params.type_k = params.type_v = _GGML_TYPES[self.kv_type]
        params.flash_attn_type = _FLASH[self.flash_attn]
        params.swa_full = self.swa_full
