"""ModelFacts from a GGUF header (see :mod:`appliance.modelfacts.gguf_header`)."""

from __future__ import annotations

import os
from collections import Counter

from gguf import GGMLQuantizationType, LlamaFileType, PoolingType

from appliance.modelfacts.errors import InvalidModelFile
from appliance.modelfacts.facts import ModelFacts
from appliance.modelfacts.gguf_header import GGUFHeader, GGUFMetadata, read_header

MAX_BLOCK_COUNT = 512
"""llama.cpp's own ceiling on layers (LLAMA_MAX_LAYERS); past it a file is hostile."""

# llama.cpp hard-codes the sliding-window layer pattern of these architectures
# (llama-model.cpp, ``hparams.set_swa_pattern(n)``): layer ``il`` uses the window
# when ``il % n < n - 1``. Architectures not listed run every layer with full
# attention in llama.cpp, whatever window the metadata states.
SWA_PATTERNS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}


def swa_layer_count(n_layer: int, pattern: int) -> int:
    """Layers using the window under llama.cpp's ``set_swa_pattern(pattern)`` rule."""
    if pattern <= 0:
        return n_layer
    return sum(1 for il in range(n_layer) if il % pattern < pattern - 1)


def _int(meta: GGUFMetadata, key: str, *, default: int | None = None, required: bool = False) -> int | None:
    """An integer metadata value; per-layer arrays give their maximum."""
    v = meta.get(key)
    if isinstance(v, tuple):
        v = max(v) if v else None
    if isinstance(v, bool) or (v is not None and not isinstance(v, int)):
        raise InvalidModelFile(f"GGUF {key} is not an integer")
    if v is None:
        if required:
            raise InvalidModelFile(f"GGUF metadata lacks {key}")
        return default
    if v < 0 or v >= 1 << 40:
        raise InvalidModelFile(f"GGUF {key} = {v} is out of range")
    return v


def _file_type(meta: GGUFMetadata, header: GGUFHeader) -> str | None:
    ft = meta.get("general.file_type")
    if isinstance(ft, int):
        try:
            return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    by_type: Counter[int] = Counter()
    for t in header.tensors:
        by_type[t.type] += t.n_bytes
    if not by_type:
        return None
    return GGMLQuantizationType(by_type.most_common(1)[0][0]).name


def _swa_layers(meta: GGUFMetadata, arch: str, n_layer: int, window: int | None) -> int:
    if not window:
        return 0
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, tuple):
        return sum(1 for flag in pattern[:n_layer] if flag)
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        return swa_layer_count(n_layer, pattern)
    if arch in SWA_PATTERNS:
        return swa_layer_count(n_layer, SWA_PATTERNS[arch])
    return 0


def facts_from_header(header: GGUFHeader) -> ModelFacts:
    """Derive :class:`ModelFacts` from a parsed header; rejects absurd shapes."""
    meta = header.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch or len(arch) > 64:
        raise InvalidModelFile("GGUF metadata lacks general.architecture")
    n_layer = _int(meta, f"{arch}.block_count", required=True)
    assert n_layer is not None
    if not 1 <= n_layer <= MAX_BLOCK_COUNT:
        raise InvalidModelFile(f"GGUF block_count {n_layer} is outside 1..{MAX_BLOCK_COUNT}")
    n_embd = _int(meta, f"{arch}.embedding_length", required=True) or 0
    n_head = _int(meta, f"{arch}.attention.head_count", default=0) or 0
    n_head_kv = _int(meta, f"{arch}.attention.head_count_kv", default=n_head) or 0
    head_dim = _int(meta, f"{arch}.attention.key_length", default=(n_embd // n_head) if n_head else 0) or 0
    value_dim = _int(meta, f"{arch}.attention.value_length")
    window = _int(meta, f"{arch}.attention.sliding_window")
    n_vocab = _int(meta, "tokenizer.ggml.tokens#count") or _int(meta, f"{arch}.vocab_size")
    pooling = _int(meta, f"{arch}.pooling_type")
    names = {t.name for t in header.tensors}
    tensor_bytes = sum(t.n_bytes for t in header.tensors)
    template = meta.get("tokenizer.chat_template")
    return ModelFacts(
        format="gguf",
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        value_head_dim=value_dim if value_dim not in (None, head_dim) else None,
        context_length=_int(meta, f"{arch}.context_length"),
        sliding_window=window or None,
        swa_layers=_swa_layers(meta, arch, n_layer, window),
        n_ff=_int(meta, f"{arch}.feed_forward_length"),
        n_vocab=n_vocab,
        n_expert=_int(meta, f"{arch}.expert_count") or None,
        n_expert_used=_int(meta, f"{arch}.expert_used_count") or None,
        tied_embeddings=("output.weight" not in names) if header.tensors else None,
        file_type=_file_type(meta, header),
        tensor_bytes=tensor_bytes,
        nonlayer_bytes=sum(t.n_bytes for t in header.tensors if not t.name.startswith("blk.")),
        parameter_count=sum(t.n_elements for t in header.tensors) or None,
        chat_template=template if isinstance(template, str) else None,
        pooling_type=PoolingType(pooling).name.lower() if pooling in {p.value for p in PoolingType} else None,
    )


def inspect_gguf(path: str | os.PathLike[str]) -> ModelFacts:
    """Read the facts of the GGUF file at ``path`` without loading its weights.

    Bounded: lengths and counts are checked before use, so a hostile file is
    rejected with :class:`InvalidModelFile` quickly and without large allocations.
    """
    return facts_from_header(read_header(path))
