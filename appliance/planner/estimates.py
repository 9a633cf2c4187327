"""Memory formulas of the planner, with the constants and where they come from.

Pure arithmetic on :class:`ModelFacts`; no I/O. Every constant below is either
llama.cpp's / vLLM's own behaviour or a measurement, stated next to it; the
benchmark ``tests/bench/bench_planner_rss.py`` re-measures the CPU ones.

llama.cpp (one engine process; one unified KV cache of n_ctx = context × parallel cells):
    total = weights + KV + compute + overhead
    KV    = Σ_layers cells(layer) × n_head_kv × (head_dim + value_head_dim) × bytes/element
            cells = n_ctx padded to 256 for full-attention layers; for sliding-window
            layers the same with swa_full (llama.cpp's default), else min(n_ctx, window × parallel + n_ubatch)
    GPU compute (VRAM, reserved in full): n_ubatch × 4 × (2·n_embd + max(n_vocab, 4·n_ff))
            on the device holding the output head, n_ubatch × 4 × (2·n_embd + 4·n_ff) elsewhere
    CPU compute (resident pages only): 6 MiB + n_ubatch × 12 × (n_embd + n_ff) + parallel × n_vocab × 4
vLLM (per GPU, tensor parallel tp, pipeline parallel pp):
    weights / (tp·pp) + KV(context × parallel) / (min(tp, n_head_kv)·pp)
    + activations 2048 × 2 × (4·n_embd + 2·n_ff/tp) + 256 MiB + runtime overhead
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.hardware.units import GiB, MiB
from appliance.modelfacts import ModelFacts

N_UBATCH = 512
"""llama.cpp's default micro-batch; the compute buffers scale with it."""
KV_PAD = 256
"""llama.cpp pads KV cells to a multiple of 256."""
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}

ENGINE_PROCESS_BYTES = 64 * MiB
"""Resident size of an engine process before the model: Python + libllama measured 43 MiB on
the reference box (a 2-core AVX-512 build machine); the worker's own code and HTTP stack are allowed ~20 MiB."""
LLAMACPP_MODEL_BASE = 10 * MiB
"""Model/context bookkeeping beside the buffers (measured 9.5 MiB across three models)."""
VOCAB_BYTES_PER_TOKEN = 160
"""llama.cpp's in-memory vocabulary (measured: 41.5 MiB for Gemma 3's 262,144 tokens)."""
CPU_COMPUTE_BASE = 6 * MiB
CPU_COMPUTE_PER_WIDTH = N_UBATCH * 12
"""Bytes per unit of (n_embd + n_ff) of the CPU compute pages a 512-token batch touches
(fit to gemma3-270m, a 1024/4096 and a 2048/5632 llama: within 2 MiB)."""
GPU_RUNTIME_BYTES = 512 * MiB
"""CUDA/HIP context and BLAS workspace per GPU used by llama.cpp."""
VLLM_GPU_OVERHEAD = 3 * GiB // 2
"""vLLM per GPU beyond torch tensors: CUDA context, NCCL buffers, CUDA graphs."""
VLLM_CPU_OVERHEAD = 5 * GiB // 2
"""vLLM CPU backend beyond weights, KV and activations (torch, engine and API processes):
0.05 of 23 GiB (1.2 GiB) left negative KV space on the reference box, 0.2 (4.7 GiB) worked,
and the engine tree of a tiny Llama measured 2816 MiB resident (tests/integration/test_vllm_real.py)."""
VLLM_BATCH_TOKENS = 2048
VLLM_SAMPLER_BYTES = 256 * MiB


def pad(n: int, to: int) -> int:
    return -(-n // to) * to


def kv_element_bytes(dtype: str) -> float:
    """Bytes per KV element for a cache type name (``f16``, ``q8_0``, ``fp8``)."""
    return KV_BYTES.get(dtype.lower(), 2.0)


def ffn_width(f: ModelFacts) -> int:
    """Feed-forward width active per token (MoE: experts used × expert width)."""
    n_ff = f.n_ff or 4 * f.n_embd
    return n_ff * max(1, f.n_expert_used or 1)


def kv_per_cell_layer(f: ModelFacts, dtype: str) -> float:
    """KV bytes of one token in one layer."""
    return f.n_head_kv * f.kv_head_dims * kv_element_bytes(dtype)


def llamacpp_kv_bytes(f: ModelFacts, ctx: int, parallel: int, dtype: str = "f16", swa_full: bool = False) -> int:
    """llama.cpp's unified KV cache for ``parallel`` slots of ``ctx`` tokens each (n_ctx = ctx × parallel).

    Matches llama.cpp 0.3.36's own ``llama_kv_cache: size`` log lines (checked for Gemma 3 at
    n_ctx 512..65536 and 1 or 8 sequences).
    """
    cells = pad(ctx * parallel, KV_PAD)
    window = 0 if swa_full else f.sliding_window or 0
    swa = min(f.swa_layers, f.n_layer) if window else 0
    swa_cells = min(cells, pad(window * parallel + N_UBATCH, KV_PAD)) if swa else 0
    per = kv_per_cell_layer(f, dtype)
    return int((f.n_layer - swa) * cells * per + swa * swa_cells * per)


def vllm_kv_bytes(f: ModelFacts, context: int, parallel: int, dtype: str = "auto") -> int:
    """vLLM's KV for ``parallel`` sequences of ``context`` tokens each (all GPUs together)."""
    swa = min(f.swa_layers, f.n_layer) if f.sliding_window else 0
    swa_tokens = min(context, f.sliding_window or context)
    per = kv_per_cell_layer(f, dtype)
    return int(((f.n_layer - swa) * context + swa * swa_tokens) * parallel * per)


@dataclass(frozen=True)
class WeightSplit:
    """Weights cut the way llama.cpp places them."""

    total: int
    embd: int
    """Token embeddings: always in host memory."""
    output: int
    """Output head: on the last GPU when every layer is offloaded (tied: a second copy there)."""
    layer: float
    """One repeating block."""
    tied: bool


def weight_bytes(f: ModelFacts, size_bytes: int) -> int:
    """Tensor bytes when the facts carry them for this file, else the file size."""
    if f.tensor_bytes and 0.8 * size_bytes <= f.tensor_bytes <= size_bytes:
        return f.tensor_bytes
    return size_bytes


def split_weights(f: ModelFacts, size_bytes: int) -> WeightSplit:
    """Embedding / output / per-layer bytes.

    Exact from the GGUF tensor table when known (``nonlayer_bytes``); otherwise the
    parameter share of the embedding matrices, ``n_vocab × n_embd × (1 if tied else 2)``
    over ``parameter_count``, applied to the file size.
    """
    total = weight_bytes(f, size_bytes)
    tied = bool(f.tied_embeddings)
    if f.nonlayer_bytes is not None and f.tensor_bytes and total == f.tensor_bytes:
        nonlayer = f.nonlayer_bytes
    elif f.parameter_count and f.n_vocab:
        share = f.n_vocab * f.n_embd * (1 if tied else 2) / f.parameter_count
        nonlayer = int(total * share)
    else:
        nonlayer = 0
    embd = nonlayer if tied else nonlayer // 2
    output = embd if tied else nonlayer - embd
    return WeightSplit(total, embd, output, (total - nonlayer) / f.n_layer, tied)


def llamacpp_gpu_compute(f: ModelFacts, with_output: bool) -> int:
    """VRAM compute buffer of one GPU (flash attention on, as llama.cpp's ``auto`` picks)."""
    widest = max(f.n_vocab or 0, 4 * ffn_width(f)) if with_output else 4 * ffn_width(f)
    return N_UBATCH * 4 * (2 * f.n_embd + widest)


def llamacpp_cpu_compute(f: ModelFacts, parallel: int) -> int:
    """Resident host compute pages plus the logits output buffer."""
    return CPU_COMPUTE_BASE + CPU_COMPUTE_PER_WIDTH * (f.n_embd + ffn_width(f)) + parallel * (f.n_vocab or 0) * 4


def llamacpp_host_overhead(f: ModelFacts) -> int:
    """Engine process, model bookkeeping and vocabulary."""
    return ENGINE_PROCESS_BYTES + LLAMACPP_MODEL_BASE + VOCAB_BYTES_PER_TOKEN * (f.n_vocab or 0)


def vllm_compute(f: ModelFacts, tp: int) -> int:
    """Activation peak of vLLM's profiling run plus sampler buffers, per GPU."""
    return VLLM_BATCH_TOKENS * 2 * (4 * f.n_embd + 2 * ffn_width(f) // tp) + VLLM_SAMPLER_BYTES
