"""Write a BERT sentence-embedding model (Hugging Face safetensors) as a GGUF that llama.cpp serves.

This is how the semantic cache's embedding model was made without torch or
transformers: the safetensors file is read with numpy (its format is a JSON
header and raw little-endian arrays), tensor names are mapped with the
``gguf`` package's BERT name map, and the WordPiece vocabulary is written the
way llama.cpp's own ``convert_hf_to_gguf.py`` writes it (``##`` continuation
pieces lose their prefix, word-initial pieces gain ``▁``; control tokens stay).

    python -m tools.bert_gguf MODEL_DIR OUT.gguf [--type q8_0|f16|f32]

``MODEL_DIR`` is a sentence-transformers folder: ``config.json``,
``model.safetensors``, ``vocab.txt`` / ``tokenizer.json`` and ``modules.json``
(+ ``1_Pooling/config.json``) for the pooling mode.
"""

from __future__ import annotations

import argparse
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
_SKIP = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_QTYPES = {
    "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}


def read_safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) from a safetensors file using numpy only."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"{name}: unsupported safetensors dtype {meta['dtype']}")
        start, end = meta["data_offsets"]
        yield name, np.frombuffer(data[start:end], dtype=dtype).reshape(meta["shape"])


def _pooling(model_dir: Path) -> gguf.PoolingType:
    modules = model_dir / "modules.json"
    if modules.is_file():
        for mod in json.loads(modules.read_text()):
            if mod["type"].endswith("Pooling"):
                cfg = json.loads((model_dir / mod["path"] / "config.json").read_text())
                if cfg.get("pooling_mode_cls_token"):
                    return gguf.PoolingType.CLS
                return gguf.PoolingType.MEAN
    return gguf.PoolingType.MEAN


def _vocab(model_dir: Path, n_vocab: int) -> tuple[list[str], list[int]]:
    tokens = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:n_vocab]
    special: set[str] = set()
    tok_json = model_dir / "tokenizer.json"
    if tok_json.is_file():
        special = {t["content"] for t in json.loads(tok_json.read_text()).get("added_tokens", []) if t.get("special")}
    else:
        special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    out, types = [], []
    for tok in tokens:
        if tok in special:
            out.append(tok)
            types.append(gguf.TokenType.CONTROL)
        else:
            out.append(tok[2:] if tok.startswith("##") else "\u2581" + tok)
            types.append(gguf.TokenType.NORMAL)
    while len(out) < n_vocab:
        out.append(f"[PAD{len(out)}]")
        types.append(gguf.TokenType.UNUSED)
    return out, types


def convert(model_dir: Path, out: Path, qtype: str = "q8_0", name: str | None = None) -> Path:
    """Write ``out`` from the sentence-transformers folder ``model_dir``; returns ``out``."""
    hp = json.loads((model_dir / "config.json").read_text())
    if hp.get("model_type") != "bert":
        raise ValueError(f"only BERT models are supported, not {hp.get('model_type')!r}")
    ftype, weight_type = _QTYPES[qtype]
    n_layer = hp["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(name or model_dir.name)
    writer.add_block_count(n_layer)
    writer.add_context_length(hp["max_position_embeddings"])
    writer.add_embedding_length(hp["hidden_size"])
    writer.add_feed_forward_length(hp["intermediate_size"])
    writer.add_head_count(hp["num_attention_heads"])
    writer.add_layer_norm_eps(hp.get("layer_norm_eps", 1e-12))
    writer.add_causal_attention(False)
    writer.add_pooling_type(_pooling(model_dir))
    writer.add_file_type(ftype)

    tokens, types = _vocab(model_dir, hp["vocab_size"])
    writer.add_token_type_count(hp.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("bert-bge")  # uncased WordPiece; what convert_hf_to_gguf picks for this vocabulary
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, n_vocab=len(tokens))
    special.add_to_gguf(writer)

    names = gguf.get_tensor_name_map(arch, n_layer)
    for hf_name, array in read_safetensors(model_dir / "model.safetensors"):
        if hf_name.startswith("bert."):
            hf_name = hf_name[5:]
        if hf_name in _SKIP or hf_name.startswith("cls."):
            continue
        new = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"cannot map tensor {hf_name}")
        data = np.ascontiguousarray(array, dtype=np.float32)
        keep_f32 = (
            data.ndim <= 1
            or new.endswith("_norm.weight")
            or not new.endswith(".weight")
            or new.startswith(("position_embd", "token_types"))
        )
        target = gguf.GGMLQuantizationType.F32 if keep_f32 else weight_type
        if target == gguf.GGMLQuantizationType.F16:
            data = data.astype(np.float16)
        elif target == gguf.GGMLQuantizationType.Q8_0:
            if data.shape[-1] % 32:
                target, data = gguf.GGMLQuantizationType.F16, data.astype(np.float16)
            else:
                data = gguf.quants.quantize(data, target)
        writer.add_tensor(new, data, raw_dtype=target if target == gguf.GGMLQuantizationType.Q8_0 else None)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", choices=sorted(_QTYPES), default="q8_0")
    parser.add_argument("--name")
    args = parser.parse_args()
    print(convert(args.model_dir, args.out, args.type, args.name))


if __name__ == "__main__":
    main()
