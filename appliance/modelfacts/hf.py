"""ModelFacts from a Hugging Face folder: ``config.json`` plus safetensors headers.

Only JSON and safetensors headers are read (never pickles, never code). Every
length is bounded: ``config.json`` and index files by size, safetensors header
lengths by the shard's size and a ceiling; shard names from the index must be
plain file names inside the folder.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from appliance.jsontypes import JsonObject
from appliance.modelfacts.errors import InvalidModelFile
from appliance.modelfacts.facts import ModelFacts
from appliance.modelfacts.gguf_facts import MAX_BLOCK_COUNT

MAX_JSON_BYTES = 8 << 20
MAX_ST_HEADER = 100 << 20
"""The safetensors format's own ceiling on header size."""
MAX_SHARDS = 4096
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 1,
    "F6_E2M3": 1,
    "F6_E3M2": 1,
}
QUANT_METHODS = {"awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4", "modelopt", "gptq_marlin", "awq_marlin"}


@contextmanager
def _reading(missing: str, unreadable: str) -> Iterator[None]:
    """A missing file or unreadable JSON inside the block becomes InvalidModelFile with these messages."""
    try:
        yield
    except FileNotFoundError:
        raise InvalidModelFile(missing) from None
    except (OSError, ValueError) as exc:
        raise InvalidModelFile(f"{unreadable}: {exc.__class__.__name__}") from None


def _json_object(data: object, what: str) -> JsonObject:
    if not isinstance(data, dict):
        raise InvalidModelFile(f"{what} is not a JSON object")
    return data


def _read_json(path: Path, what: str) -> JsonObject:
    with _reading(f"{what} is missing", f"{what} is not readable JSON"):
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InvalidModelFile(f"{what} is {size} bytes (limit {MAX_JSON_BYTES})")
        data = json.loads(path.read_bytes())
    return _json_object(data, what)


def _pos_int(cfg: JsonObject, key: str, default: int | None = None) -> int | None:
    v = cfg.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 40:
        raise InvalidModelFile(f"config.json {key} = {v!r} is not a sensible integer")
    return v


def _shard_names(folder: Path) -> list[str]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index, "model.safetensors.index.json").get("weight_map")
        if not isinstance(weight_map, dict):
            raise InvalidModelFile("model.safetensors.index.json has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
    else:
        names = sorted(p.name for p in folder.glob("*.safetensors"))
    if len(names) > MAX_SHARDS:
        raise InvalidModelFile(f"{len(names)} safetensors shards (limit {MAX_SHARDS})")
    for name in names:
        if "/" in name or "\\" in name or name in (".", "..") or "\x00" in name or not name.endswith(".safetensors"):
            raise InvalidModelFile(f"shard name {name!r} is not a plain .safetensors file name")
    return names


def read_safetensors_header(path: Path) -> JsonObject:
    """The JSON header of one safetensors file, bounds-checked against the file size."""
    with _reading(f"shard {path.name} is missing", f"{path.name} header is unreadable"), path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(8)
        if len(raw) < 8:
            raise InvalidModelFile(f"{path.name} is too small to be safetensors")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_ST_HEADER or n > size - 8:
            raise InvalidModelFile(f"{path.name} header length {n} is past the file size or the limit")
        data = json.loads(fh.read(n))
    header = _json_object(data, f"{path.name} header")
    data_size = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            ok = isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= data_size
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise InvalidModelFile(f"{path.name} tensor {str(name)[:64]} has offsets outside the file")
    return header


def _weights(folder: Path) -> tuple[int | None, int | None, int | None, str | None]:
    """(tensor bytes, non-layer bytes, element count, dominant dtype) over all shards."""
    names = _shard_names(folder)
    if not names:
        return None, None, None, None
    total = nonlayer = elements = 0
    by_dtype: dict[str, int] = {}
    for name in names:
        for tname, info in read_safetensors_header(folder / name).items():
            if tname == "__metadata__":
                continue
            start, end = info["data_offsets"]
            nbytes = end - start
            total += nbytes
            if ".layers." not in tname and ".h." not in tname and ".blocks." not in tname:
                nonlayer += nbytes
            count = 1
            for d in info.get("shape", []):
                count *= int(d)
            elements += count
            dtype = str(info.get("dtype", "?"))
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    dominant = max(by_dtype, key=by_dtype.__getitem__).lower() if by_dtype else None
    return total, nonlayer, elements, dominant


def _swa_layers(cfg: JsonObject, n_layer: int, window: int | None) -> int:
    if not window:
        return 0
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        return sum(1 for t in layer_types[:n_layer] if t == "sliding_attention")
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return sum(1 for il in range(n_layer) if (il + 1) % pattern != 0)
    if cfg.get("model_type") == "gemma2":
        return n_layer // 2
    return n_layer


def inspect_hf(folder: str | os.PathLike[str]) -> ModelFacts:
    """Read the facts of a Hugging Face model folder (config.json + safetensors).

    Raises :class:`InvalidModelFile` when config.json is missing or malformed,
    when the model needs remote code (``auto_map``), when a shard header is
    out of bounds, or when a shard name escapes the folder.
    """
    root = Path(folder)
    top = _read_json(root / "config.json", "config.json")
    if "auto_map" in top:
        raise InvalidModelFile("config.json declares auto_map: the model needs remote code, which the appliance never runs")
    cfg = dict(top)
    if isinstance(top.get("text_config"), dict):  # multimodal wrappers (Gemma 3 4B+, Llava)
        cfg = {**top, **top["text_config"]}
    n_layer = _pos_int(cfg, "num_hidden_layers") or _pos_int(cfg, "n_layer") or 0
    if not 1 <= n_layer <= MAX_BLOCK_COUNT:
        raise InvalidModelFile(f"config.json num_hidden_layers {n_layer} is outside 1..{MAX_BLOCK_COUNT}")
    n_embd = _pos_int(cfg, "hidden_size") or 0
    n_head = _pos_int(cfg, "num_attention_heads") or 0
    n_head_kv = _pos_int(cfg, "num_key_value_heads", n_head) or n_head
    head_dim = _pos_int(cfg, "head_dim") or (n_embd // n_head if n_head else 0)
    window = None
    if cfg.get("use_sliding_window", True) is not False:
        window = _pos_int(cfg, "sliding_window")
    quant = cfg.get("quantization_config")
    quant_method = str(quant.get("quant_method", "")).lower() or None if isinstance(quant, dict) else None
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    tensor_bytes, nonlayer, elements, dominant = _weights(root)
    tied = cfg.get("tie_word_embeddings", True)
    template = None
    tok_cfg = root / "tokenizer_config.json"
    if tok_cfg.exists():
        t = _read_json(tok_cfg, "tokenizer_config.json").get("chat_template")
        template = t if isinstance(t, str) else None
    file_type = str(dtype).replace("bfloat16", "bf16").replace("float16", "f16").replace("float32", "f32") if dtype else dominant
    return ModelFacts(
        format="safetensors",
        architecture=str(cfg.get("model_type") or (cfg.get("architectures") or ["unknown"])[0]),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        context_length=_pos_int(cfg, "max_position_embeddings"),
        sliding_window=window or None,
        swa_layers=_swa_layers(cfg, n_layer, window),
        n_ff=_pos_int(cfg, "intermediate_size"),
        n_vocab=_pos_int(cfg, "vocab_size"),
        n_expert=_pos_int(cfg, "num_local_experts") or _pos_int(cfg, "num_experts"),
        n_expert_used=_pos_int(cfg, "num_experts_per_tok"),
        tied_embeddings=bool(tied),
        file_type=quant_method if quant_method in QUANT_METHODS else file_type,
        quant_method=quant_method,
        tensor_bytes=tensor_bytes,
        nonlayer_bytes=nonlayer,
        parameter_count=elements if elements and not quant_method else None,
        chat_template=template,
        pooling_type=None,
    )
