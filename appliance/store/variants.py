"""What the store says about a variant: :class:`VariantInfo`, :class:`ResolvedVariant` with its files, and
:class:`AvailableVariant`, one known on the hub but not downloaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from appliance.jsontypes import JsonObject
from appliance.modelfacts import ModelFacts

AVAILABLE = "available"


@dataclass(frozen=True)
class AvailableVariant:
    """A variant of a hub repository that is not downloaded: what pulling it would install."""

    variant: str
    quantization: str | None
    size_bytes: int
    source: str  # hf:ORG/REPO/FILE[@REVISION]: the spec that pulls it


@dataclass(frozen=True)
class VariantInfo:
    id: int
    name: str  # family:variant
    family: str
    variant: str
    format: str  # gguf | safetensors
    quantization: str | None
    path: str  # relative to the store
    size_bytes: int
    sha256: str | None
    status: str  # downloading | ready | corrupt | available (known on the hub, not downloaded: no files)
    source: str | None
    parent: str | None  # family:variant it was quantized from
    facts: JsonObject
    is_default: bool
    pinned: bool
    created_at: float

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @property
    def available(self) -> bool:
        return self.status == AVAILABLE

    @property
    def model_facts(self) -> ModelFacts | None:
        return ModelFacts.from_dict(self.facts) if self.facts.get("architecture") else None


@dataclass(frozen=True)
class ResolvedVariant(VariantInfo):
    file: Path | None = None  # absolute: the GGUF file or the HF folder
