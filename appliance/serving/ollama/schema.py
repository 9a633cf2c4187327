"""Request bodies of the Ollama API (``/api/*``), as Ollama's reference spells them.

As on the OpenAI surface, nothing a client sends is dropped in silence: an
unknown field is a 400 naming it, and every declared field either changes the
answer (it is translated by :mod:`appliance.serving.ollama.to_openai`), is
refused (a 400 naming it) when it asks for something the appliance does not do,
or is listed in :data:`IGNORED_OPTIONS` / documented in the README as ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from appliance.jsontypes import JsonObject
from appliance.openai_schema import ModelName, Penalty, Probability, Temperature

Text = Annotated[str, msgspec.Meta(max_length=16_000_000)]
StopWords = Annotated[list[Annotated[str, msgspec.Meta(max_length=500)]], msgspec.Meta(max_length=16)]
#: A JSON schema, or "json" for any JSON object, or "" for free text.
Format = Literal["", "json"] | JsonObject | None
#: Ollama's keep_alive: a duration ("5m"), seconds, or a negative number for "forever".
KeepAlive = Annotated[str, msgspec.Meta(max_length=32)] | float | None
#: Ollama's think: on/off, or an effort level for models that take one.
Think = bool | Literal["low", "medium", "high"] | None

#: Load-time and runtime options: the appliance plans each load itself (context, layers on the GPU,
#: threads, batch, memory mapping), so these are accepted and have no effect.
IGNORED_OPTIONS = (
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "numa",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "embedding_only",
    "num_keep",
    "penalize_newline",
    "mirostat_tau",
    "mirostat_eta",
)

#: Options the engines do not serve, with the one value of each that asks for what they do anyway.
NEUTRAL_OPTIONS: dict[str, float] = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "repeat_last_n": 64}


class _Body(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    pass


class Options(_Body):
    """Ollama's ``options``: sampling parameters, and load-time ones that are ignored (:data:`IGNORED_OPTIONS`)."""

    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    min_p: Probability | None = None
    seed: int | None = None
    num_predict: Annotated[int, msgspec.Meta(ge=-2, le=1_000_000)] | None = None
    stop: StopWords | None = None
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # refused unless neutral (NEUTRAL_OPTIONS)
    mirostat: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    repeat_last_n: int | None = None
    # ignored (IGNORED_OPTIONS)
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    num_thread: int | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    vocab_only: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    embedding_only: bool | None = None
    num_keep: int | None = None
    penalize_newline: bool | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None


class ToolCallFunction(_Body):
    name: Annotated[str, msgspec.Meta(max_length=200)]
    arguments: JsonObject = msgspec.field(default_factory=dict)
    index: int | None = None


class ToolCall(_Body):
    function: ToolCallFunction
    id: str | None = None
    type: Literal["function"] | None = None


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: Text | None = None  # an earlier answer's reasoning: not sent back to the model (documented)


class ChatRequest(_Body):
    model: ModelName
    messages: Annotated[list[Message], msgspec.Meta(max_length=4096)] = msgspec.field(default_factory=list)
    tools: list[JsonObject] | None = None
    format: Format = None
    options: Options | None = None
    stream: bool | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class GenerateRequest(_Body):
    model: ModelName
    prompt: Text | None = None
    suffix: str | None = None
    system: Text | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    format: Format = None
    images: list[str] | None = None
    options: Options | None = None
    stream: bool | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class EmbedRequest(_Body):
    model: ModelName
    input: Annotated[str, msgspec.Meta(max_length=1000000)] | Annotated[list[str], msgspec.Meta(min_length=1, max_length=2048)]
    truncate: bool | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    dimensions: int | None = None


class EmbeddingsRequest(_Body):
    model: ModelName
    prompt: Annotated[str, msgspec.Meta(max_length=1_000_000)] = ""
    options: Options | None = None
    keep_alive: KeepAlive = None


class ShowRequest(_Body):
    model: ModelName | None = None
    name: ModelName | None = None  # the older spelling of ``model``
    verbose: bool | None = None


class PullRequest(_Body):
    model: ModelName | None = None
    name: ModelName | None = None
    insecure: bool | None = None
    stream: bool | None = None


class DeleteRequest(_Body):
    model: ModelName | None = None
    name: ModelName | None = None
