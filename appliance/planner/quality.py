"""Quality order of quantizations, best first, for choosing among variants.

Ordered by published perplexity/KL-divergence comparisons (llama.cpp's
``quantize --help`` table and its k-quant PRs): higher bits first, k-quants above
legacy quants of similar size, 4-bit AWQ/GPTQ level with Q4_K_M.
"""

from __future__ import annotations

from appliance.planner.types import Variant

QUALITY_ORDER: tuple[str, ...] = (
    "F32",
    "BF16",
    "F16",
    "Q8_0",
    "FP8",
    "COMPRESSED-TENSORS",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_1",
    "Q5_0",
    "Q4_K_M",
    "AWQ",
    "GPTQ",
    "Q4_K_S",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_1",
    "Q4_0",
    "MXFP4",
    "MXFP4_MOE",
    "Q3_K_L",
    "Q3_K_M",
    "IQ3_M",
    "IQ3_S",
    "Q3_K_S",
    "IQ3_XS",
    "IQ3_XXS",
    "Q2_K",
    "Q2_K_S",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ2_0",
    "TQ1_0",
)
_ALIASES = {"FP16": "F16", "FLOAT16": "F16", "BFLOAT16": "BF16", "FLOAT32": "F32", "FP32": "F32", "INT8": "Q8_0"}
_RANK = {name: i for i, name in enumerate(QUALITY_ORDER)}


def normalise(name: str | None) -> str:
    """Upper-case canonical quantization name (``q4_k_m`` -> ``Q4_K_M``, ``bfloat16`` -> ``BF16``)."""
    n = (name or "").strip().upper().replace("-", "_") if name else ""
    n = n.replace("COMPRESSED_TENSORS", "COMPRESSED-TENSORS")
    return _ALIASES.get(n, n)


def rank(name: str | None) -> int:
    """Position in :data:`QUALITY_ORDER`; unknown names rank below every known one."""
    return _RANK.get(normalise(name), len(QUALITY_ORDER))


def quantization_of(v: Variant) -> str:
    """The variant's quantization: catalogue value, else the file's own."""
    return normalise(v.quantization or v.facts.quant_method or v.facts.file_type or "")


def quality_key(v: Variant) -> tuple[int, int]:
    """Sort key, best first: quality rank, then larger files first."""
    return rank(quantization_of(v)), -v.size_bytes


def meets_floor(v: Variant, floor: str | None) -> bool:
    return floor is None or rank(quantization_of(v)) <= rank(floor)
