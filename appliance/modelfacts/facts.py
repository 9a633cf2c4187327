"""The architecture facts of a model file, as the planner and the model store need them.

:class:`ModelFacts` is what :func:`appliance.modelfacts.inspect_gguf` and
:func:`appliance.modelfacts.inspect_hf` return. It is a frozen dataclass of plain
values that round-trips through JSON (:meth:`ModelFacts.to_dict` /
:meth:`ModelFacts.from_dict`), so the store can keep it in ``ModelVariant.facts``
and the planner can read it back without touching the file again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from appliance.jsontypes import JsonObject


@dataclass(frozen=True)
class ModelFacts:
    """Shape and content facts of one model variant.

    Sizes are in bytes, counts are plain integers. ``None`` means "not stated by
    the file and not derivable"; the planner then falls back to a documented
    estimate.
    """

    format: str
    """``gguf`` or ``safetensors``."""
    architecture: str
    """GGUF ``general.architecture`` (``llama``, ``gemma3``) or HF ``model_type``."""
    n_layer: int
    """Repeating transformer blocks."""
    n_embd: int
    """Hidden (embedding) size."""
    n_head: int
    """Attention (query) heads."""
    n_head_kv: int
    """Key/value heads (grouped-query attention); equals ``n_head`` without GQA."""
    head_dim: int
    """Size of one key head."""
    value_head_dim: int | None = None
    """Size of one value head when it differs from ``head_dim``."""
    context_length: int | None = None
    """Context the model was trained for."""
    sliding_window: int | None = None
    """Window of sliding-window attention layers, when the runtime uses it."""
    swa_layers: int = 0
    """How many of the ``n_layer`` blocks use the sliding window (0: none)."""
    n_ff: int | None = None
    """Feed-forward (intermediate) size of one expert."""
    n_vocab: int | None = None
    """Vocabulary size."""
    n_expert: int | None = None
    """Experts per MoE layer (None for dense models)."""
    n_expert_used: int | None = None
    """Experts active per token."""
    tied_embeddings: bool | None = None
    """Whether the output head reuses the token embedding matrix."""
    file_type: str | None = None
    """Quantization of the weights: GGUF file type (``Q4_K_M``) or HF dtype (``bf16``)."""
    quant_method: str | None = None
    """HF ``quantization_config.quant_method`` (``awq``, ``gptq``, ``fp8``, ``compressed-tensors``)."""
    tensor_bytes: int | None = None
    """Bytes of all weight tensors."""
    nonlayer_bytes: int | None = None
    """Bytes of tensors outside the repeating blocks (embeddings, output head, final norm)."""
    parameter_count: int | None = None
    """Parameters (elements of all tensors) when derivable."""
    chat_template: str | None = None
    """Jinja chat template shipped in the file (untrusted: render only sandboxed)."""
    pooling_type: str | None = None
    """Embedding pooling (``mean``, ``cls``, ``last``, ``rank``) for embedding models."""

    @property
    def kv_head_dims(self) -> int:
        """Key plus value head size: the per-head, per-token KV elements of one layer."""
        return self.head_dim + (self.value_head_dim if self.value_head_dim is not None else self.head_dim)

    def to_dict(self) -> JsonObject:
        """Plain JSON-able dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> ModelFacts:
        """Inverse of :meth:`to_dict`; unknown keys are ignored so older rows still load."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
