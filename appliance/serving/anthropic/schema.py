"""Request bodies of the Anthropic Messages API (``POST /v1/messages``), in the order of Anthropic's reference.

Like :mod:`appliance.openai_schema`, nothing a client sends is dropped in
silence: the body names the fields that change the answer, the fields that
are harmless to ignore (``metadata``, ``cache_control`` on blocks and tools:
accepted, never forwarded: see :data:`IGNORED`), and fields declared only so
that a value the appliance cannot serve is refused by name (``thinking``
unless disabled, image blocks). Any other field is refused by msgspec as
unknown. ``temperature``, ``top_p`` and ``top_k`` are served although recent
Anthropic clients no longer name them (they travel as extra body fields).

Content blocks are tagged unions on ``type``; a block type outside them
(``document``, ``thinking``, server tools) is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from appliance.jsontypes import JsonObject
from appliance.openai_schema import ModelName, PositiveInt, Probability

#: Anthropic's temperature range (OpenAI's goes to 2).
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
StopSequence = Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")]

#: The fields accepted and ignored, with why (the README lists them).
IGNORED = {
    "metadata": "Anthropic's request metadata (user_id) does not change the answer.",
    "cache_control": (
        "prompt-caching hints: the appliance's own response cache and the engine's prefix reuse apply by themselves."
    ),
    "service_tier": "there is one tier.",
    "output_config.effort": "the served models have no thinking budget to set.",
    "caller": 'on tool_use blocks, only {"type": "direct"}: the client ran the tool, as every tool here.',
}

#: Refused values: the message a client gets.
REFUSED = {
    "thinking": 'Extended thinking is not supported: leave thinking unset or {"type": "disabled"}.',
    "image": "Image content blocks are not supported: the appliance serves text models.",
}


class _Base(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Every object of the body: an unknown field is a 400, not a silent drop."""


class CacheControl(_Base):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Base, tag="text", tag_field="type"):
    text: str
    cache_control: CacheControl | None = None  # ignored (IGNORED)
    citations: Annotated[list[JsonObject], msgspec.Meta(max_length=0)] | None = None  # none accepted


class ImageBlock(_Base, tag="image", tag_field="type"):
    """Declared so that an image is refused by name (:data:`REFUSED`)."""

    source: JsonObject
    cache_control: CacheControl | None = None


class DirectCaller(_Base):
    type: Literal["direct"]


class ToolUseBlock(_Base, tag="tool_use", tag_field="type"):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    name: ToolName
    input: JsonObject
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None  # ignored (IGNORED): the client called the tool itself


class ToolResultBlock(_Base, tag="tool_result", tag_field="type"):
    tool_use_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


ContentBlock = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock


class InputMessage(_Base):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], msgspec.Meta(max_length=4096)]


class Tool(_Base):
    name: ToolName
    input_schema: JsonObject
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceAuto(_Base, tag="auto", tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Base, tag="any", tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Base, tag="tool", tag_field="type"):
    name: ToolName
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Base, tag="none", tag_field="type"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class Thinking(_Base):
    """Only ``disabled`` is served; any other type is refused by name (:data:`REFUSED`)."""

    type: Literal["disabled", "enabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(_Base):
    type: Literal["json_schema"]
    schema: JsonObject


class OutputConfig(_Base):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # ignored (IGNORED)
    format: OutputFormat | None = None


class Metadata(_Base):
    user_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class MessagesRequest(_Base):
    model: ModelName
    max_tokens: PositiveInt
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1, max_length=4096)]
    cache_control: CacheControl | None = None  # ignored (IGNORED)
    metadata: Metadata | None = None  # ignored (IGNORED)
    output_config: OutputConfig | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # ignored (IGNORED)
    stop_sequences: Annotated[list[StopSequence], msgspec.Meta(max_length=16)] | None = None
    stream: bool | None = None
    system: str | list[TextBlock] | None = None
    temperature: Temperature | None = None
    thinking: Thinking | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[Tool], msgspec.Meta(max_length=128)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    top_p: Probability | None = None


class CountTokensRequest(_Base):
    """``/v1/messages/count_tokens``: the fields of a message request that make its prompt."""

    model: ModelName
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1, max_length=4096)]
    cache_control: CacheControl | None = None  # ignored (IGNORED)
    output_config: OutputConfig | None = None
    system: str | list[TextBlock] | None = None
    thinking: Thinking | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[Tool], msgspec.Meta(max_length=128)] | None = None
