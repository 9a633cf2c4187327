"""Pure parts of hub pulls: the spec, the listing's variants, what a safetensors repository gives, the token's origin."""

from __future__ import annotations

import pytest

from appliance.errors import BadRequest
from appliance.store.errors import RefusedImport, UnsafePath
from appliance.store.hub.credentials import HubCredentials
from appliance.store.hub.listing import HubFile, family_of, files_from_tree, gguf_sets, hf_selection, quant_of
from appliance.store.hub.spec import HubSpec, parse_spec


@pytest.mark.parametrize(
    "raw, spec",
    [
        ("hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF", HubSpec("bartowski/Qwen2.5-0.5B-Instruct-GGUF")),
        ("hf:org/repo:Q4_K_M", HubSpec("org/repo", quant="Q4_K_M")),
        ("hf:org/repo:q8_0@v2", HubSpec("org/repo", "v2", quant="q8_0")),
        ("hf:org/repo/sub/m-Q8_0.gguf", HubSpec("org/repo", file="sub/m-Q8_0.gguf")),
        ("hf:org/repo/m-00001-of-00002.gguf@0123abcd", HubSpec("org/repo", "0123abcd", file="m-00001-of-00002.gguf")),
    ],
)
def test_specs_parse(raw: str, spec: HubSpec) -> None:
    assert parse_spec(raw) == spec
    assert parse_spec(str(spec)) == spec


@pytest.mark.parametrize(
    "raw",
    [
        "hf:",
        "hf:org",
        "hf:org/",
        "hf:/repo",
        "hf:org/repo:",
        "hf:org/repo:Q4-K",
        "hf:org/repo@",
        "hf:org/repo@a/b",
        "hf:org/repo/x.bin",
        "hf:org/repo/../x.gguf",
        "hf:org/repo/a\\b.gguf",
        "https://huggingface.co/org/repo",
        "hf:org/re po",
    ],
)
def test_bad_specs_are_refused(raw: str) -> None:
    with pytest.raises(BadRequest):
        parse_spec(raw)


def _f(path: str, size: int = 10) -> HubFile:
    return HubFile(path, size, None)


def test_variants_of_a_listing() -> None:
    files = [
        _f("README.md"),
        _f("M-Q4_K_M.gguf", 40),
        _f("M-Q8_0.gguf", 80),
        _f("mmproj-M-f16.gguf", 5),
        _f("Q6_K/M-Q6_K-00001-of-00002.gguf", 30),
        _f("Q6_K/M-Q6_K-00002-of-00002.gguf", 30),
        _f("M-F16-00001-of-00003.gguf", 50),
        _f("M-F16-00002-of-00003.gguf", 50),
    ]  # incomplete: no variant
    sets = gguf_sets(files)
    assert [(s.variant, s.quant, s.size, len(s.files)) for s in sets] == [
        ("q4_k_m", "Q4_K_M", 40, 1),
        ("q6_k", "Q6_K", 60, 2),
        ("q8_0", "Q8_0", 80, 1),
    ]
    assert [f.path for f in sets[1].files] == ["Q6_K/M-Q6_K-00001-of-00002.gguf", "Q6_K/M-Q6_K-00002-of-00002.gguf"]


def test_two_files_of_one_quantization_are_named_after_their_files() -> None:
    sets = gguf_sets([_f("a/Model-Q4_0.gguf"), _f("b/Other-Q4_0.gguf")])
    assert sorted(s.variant for s in sets) == ["model-q4_0", "other-q4_0"]


def test_names_from_repositories_and_files() -> None:
    assert family_of("bartowski/Qwen2.5-0.5B-Instruct-GGUF") == "qwen2.5-0.5b-instruct"
    assert quant_of("Llama-3.2-1B-Instruct-IQ4_XS.gguf") == "IQ4_XS" and quant_of("model.gguf") is None
    assert quant_of("mixtral-8x7b.Q8_0.gguf") == "Q8_0"


def test_a_tree_listing_is_checked() -> None:
    entries = [
        {"type": "directory", "path": "sub", "size": 0},
        {"type": "file", "path": "sub/m.gguf", "size": 3, "lfs": {"oid": "AB" * 32, "size": 3}},
        {"type": "file", "path": "config.json", "size": 2, "oid": "0" * 40},
    ]
    assert files_from_tree(entries) == [HubFile("sub/m.gguf", 3, "ab" * 32), HubFile("config.json", 2, None)]
    for path in ("../m.gguf", "/m.gguf", "a/../../m.gguf", "a\\m.gguf", "m\n.gguf"):
        with pytest.raises(UnsafePath):
            files_from_tree([{"type": "file", "path": path, "size": 1}])


def test_a_safetensors_repository_gives_weights_config_and_tokenizer_only() -> None:
    files = [
        _f(p)
        for p in (
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "modeling_x.py",
            "pytorch_model.bin",
            "README.md",
            "onnx/model.onnx",
            "sub/model.safetensors",
        )
    ]
    assert [f.path for f in hf_selection(files)] == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    with pytest.raises(RefusedImport):
        hf_selection([_f("config.json"), _f("pytorch_model.bin")])


def test_the_token_goes_to_the_hub_origin_only() -> None:
    creds = HubCredentials("https://hub.example", "hf_secret_token_value")
    assert creds.headers_for("https://hub.example/api/models/x") == {"Authorization": "Bearer hf_secret_token_value"}
    assert creds.headers_for("https://HUB.example:443/x") != {}
    for other in (
        "http://hub.example/x",
        "https://hub.example:8443/x",
        "https://cdn.hub.example/x",
        "https://evil.example/x",
        "https://hub.example.evil.example/x",
    ):
        assert creds.headers_for(other) == {}
    assert "hf_secret" not in repr(creds)
    assert HubCredentials("https://hub.example", None).headers_for("https://hub.example/x") == {}


def test_a_single_file_variant_may_not_be_named_like_a_split_part(tmp_path) -> None:
    from tests.ggufkit import make_tiny_gguf
    from tests.storekit import make_store

    store = make_store(tmp_path / "data")
    with pytest.raises(BadRequest, match="split model"):
        store.import_path(str(make_tiny_gguf(tmp_path / "m.gguf")), name="m:x-00001-of-00002")
    assert store.list() == []
