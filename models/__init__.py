"""The model catalog: families of open models and the variants each is published in.

Each ``*.toml`` file beside this module holds one or more ``[[family]]`` tables, each
with its architecture facts (``[family.facts]``, real published numbers from the
model's ``config.json``) and its ``[[family.variant]]`` tables: GGUF quantizations
(F16 … Q2_K) for llama.cpp and Hugging Face safetensors folders (bf16, fp8, AWQ,
GPTQ) for vLLM. Variants inherit the family's license and facts unless they set
their own.

``size_bytes`` is the published file size where ``size_estimated = false``;
otherwise it is an estimate from the parameter count and the format's bits per
weight, good enough for planning and the free-space check (a pull trusts the
server's Content-Length and the sha256, never this number). ``sha256`` appears
only where the digest was verified.

The catalog is read by :func:`load_catalog` when asked, never at import time.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"

GGUF_QUANTIZATIONS = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_0",
    "Q3_K_M",
    "Q3_K_S",
    "Q3_K_L",
    "Q2_K",
)
HF_QUANTIZATIONS = ("bf16", "fp16", "fp8", "awq-int4", "gptq-int4", "gptq-int8")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArchFacts(_Strict):
    """Architecture facts the planner needs (memory = weights + KV cache + buffers).

    Fields carry :class:`appliance.modelfacts.ModelFacts`' names; the catalog files
    keep their short keys (``layers``, ``heads``, ``kv_heads``, ...), mapped here
    by each field's alias.
    """

    architecture: str = Field(description="llama.cpp / transformers architecture name, e.g. llama, qwen2, gemma3.")
    parameter_count: int = Field(alias="params", gt=0, description="Total parameter count.")
    active_parameter_count: int | None = Field(
        default=None, alias="active_params", gt=0, description="Parameters used per token (mixture-of-experts)."
    )
    context_length: int = Field(gt=0, description="Longest context the model was trained or extended for, in tokens.")
    n_layer: int = Field(alias="layers", gt=0, le=512)
    n_head: int = Field(alias="heads", gt=0)
    n_head_kv: int = Field(alias="kv_heads", gt=0)
    head_dim: int = Field(gt=0)
    n_embd: int = Field(alias="embedding", gt=0, description="Hidden size (d_model).")
    n_vocab: int = Field(alias="vocab", gt=0)
    sliding_window: int | None = Field(
        default=None, gt=0, description="Local attention window of the sliding-window layers, if any."
    )
    sliding_window_pattern: int | None = Field(
        default=None, gt=0, description="Every Nth layer is global; the others use the window."
    )
    n_expert: int | None = Field(default=None, alias="experts", gt=1)
    n_expert_used: int | None = Field(default=None, alias="experts_used", gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> ArchFacts:
        # Messages name the catalog files' keys.
        if self.n_head % self.n_head_kv:
            raise ValueError(f"heads ({self.n_head}) must be a multiple of kv_heads ({self.n_head_kv})")
        if self.sliding_window is not None and self.sliding_window >= self.context_length:
            raise ValueError("sliding_window must be shorter than context_length")
        if (self.n_expert is None) != (self.n_expert_used is None):
            raise ValueError("experts and experts_used go together")
        if self.n_expert is not None and self.n_expert_used is not None and self.n_expert_used > self.n_expert:
            raise ValueError("experts_used cannot exceed experts")
        return self


class CatalogVariant(_Strict):
    """One published variant of a family: a GGUF file or a safetensors folder."""

    name: str = Field(pattern=NAME_PATTERN, description="Variant name, e.g. q4_k_m, bf16, awq-int4.")
    format: Literal["gguf", "safetensors"]
    quantization: str
    size_bytes: int = Field(gt=0)
    size_estimated: bool = True
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)
    url: HttpUrl | None = Field(default=None, description="A GGUF file's download URL, or a Hugging Face repository's page.")
    package: str | None = Field(default=None, description="Python package (registry name) that ships the file.")
    package_module: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Its import name; it must offer assemble(path)."
    )
    license: str | None = None
    facts: ArchFacts | None = None

    @model_validator(mode="after")
    def _source(self) -> CatalogVariant:
        if (self.url is None) == (self.package is None):
            raise ValueError(f"variant {self.name}: give exactly one of url or package")
        if (self.package is None) != (self.package_module is None):
            raise ValueError(f"variant {self.name}: package and package_module go together")
        allowed = GGUF_QUANTIZATIONS if self.format == "gguf" else HF_QUANTIZATIONS
        if self.quantization not in allowed:
            raise ValueError(f"variant {self.name}: quantization {self.quantization!r} is not one of {allowed}")
        if self.url is not None and self.format == "gguf" and not (self.url.path or "").endswith(".gguf"):
            raise ValueError(f"variant {self.name}: a GGUF variant's url must name a .gguf file")
        return self

    @property
    def filename(self) -> str | None:
        """The file name a GGUF download is stored under."""
        if self.url is not None and self.format == "gguf":
            return (self.url.path or "").rsplit("/", 1)[-1]
        return None


class CatalogFamily(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    title: str
    description: str | None = None
    license: str
    homepage: HttpUrl
    default_variant: str
    chat: bool = Field(
        default=True, description="Whether the models ship a chat template; false for base models, which complete text."
    )
    facts: ArchFacts
    variants: list[CatalogVariant] = Field(alias="variant", min_length=1)

    @model_validator(mode="after")
    def _defaults(self) -> CatalogFamily:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: duplicate variant names")
        if self.default_variant not in names:
            raise ValueError(f"family {self.name}: default_variant {self.default_variant!r} is not one of its variants")
        # Variants inherit the family's license and facts unless they set their own.
        inherited = [
            v.model_copy(update={"license": v.license or self.license, "facts": v.facts or self.facts}) for v in self.variants
        ]
        object.__setattr__(self, "variants", inherited)
        return self

    def variant(self, name: str) -> CatalogVariant | None:
        return next((v for v in self.variants if v.name == name), None)


class CatalogFile(_Strict):
    families: list[CatalogFamily] = Field(alias="family", min_length=1)


class Catalog:
    """All families of all catalog files, looked up by name."""

    def __init__(self, families: list[CatalogFamily]):
        self.families: dict[str, CatalogFamily] = {}
        for family in families:
            if family.name in self.families:
                raise ValueError(f"family {family.name} is defined twice")
            self.families[family.name] = family

    def family(self, name: str) -> CatalogFamily | None:
        return self.families.get(name)

    def variant(self, family: str, variant: str | None = None) -> CatalogVariant | None:
        """The catalog entry for ``family`` and ``variant`` (the family's default when None)."""
        fam = self.families.get(family)
        if fam is None:
            return None
        return fam.variant(variant or fam.default_variant)

    def by_url(self, url: str) -> tuple[CatalogFamily, CatalogVariant] | None:
        for fam in self.families.values():
            for var in fam.variants:
                if var.url is not None and str(var.url) == url:
                    return fam, var
        return None


def catalog_files() -> list[Path]:
    return sorted(Path(str(p)) for p in files(__name__).iterdir() if p.name.endswith(".toml"))


def load_catalog_file(path: Path) -> CatalogFile:
    return CatalogFile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))


def load_catalog(paths: list[Path] | None = None) -> Catalog:
    """Read and validate every catalog file (pydantic raises on the first bad entry)."""
    families: list[CatalogFamily] = []
    for path in paths if paths is not None else catalog_files():
        families.extend(load_catalog_file(path).families)
    return Catalog(families)
