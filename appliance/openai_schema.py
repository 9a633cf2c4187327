"""Request bodies of the OpenAI-compatible API, in the order of OpenAI's reference.

Fields after the ``# --- extensions`` marker are not OpenAI's; they follow
llama.cpp and vLLM (``top_k``, ``min_p``, ``repeat_penalty``). Unknown fields
are ignored, as OpenAI's own server does. Structs are re-encoded with
``omit_defaults`` when forwarded, so unset fields are never sent to engines.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from appliance.jsontypes import JsonObject

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Stop = Union[Annotated[str, msgspec.Meta(max_length=500)], Annotated[list[Annotated[str, msgspec.Meta(max_length=500)]], msgspec.Meta(max_length=16)], None]


COMPLETION_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI and vLLM


class _Base(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class StreamOptions(_Base):
    include_usage: bool | None = None


class ResponseFormat(_Base):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonObject | None = None


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[JsonObject], None] = None
    name: str | None = None
    tool_calls: list[JsonObject] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Base):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=4096)]
    model: ModelName
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None
    max_completion_tokens: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    presence_penalty: Penalty | None = None
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    tool_choice: Union[str, JsonObject, None] = None
    tools: list[JsonObject] | None = None
    top_p: Probability | None = None
    user: str | None = None
    # --- extensions (llama.cpp / vLLM)
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    min_p: Probability | None = None
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] | None = None


class CompletionRequest(_Base):
    model: ModelName
    prompt: Union[Annotated[str, msgspec.Meta(min_length=0)], Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]]
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None
    max_tokens: PositiveInt | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    presence_penalty: Penalty | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    user: str | None = None
    # --- extensions (llama.cpp / vLLM)
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    min_p: Probability | None = None
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] | None = None
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        # OpenAI and vLLM default a completion to 16 tokens; set it here so it is forwarded and reserved
        if self.max_tokens is None:
            self.max_tokens = COMPLETION_DEFAULT_MAX_TOKENS


class EmbeddingRequest(_Base):
    input: Union[Annotated[str, msgspec.Meta(max_length=1_000_000)], Annotated[list[str], msgspec.Meta(min_length=1, max_length=2048)]]
    model: ModelName
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: PositiveInt | None = None
    user: str | None = None


class ResponsesRequest(_Base):
    """``/v1/responses`` for plain text: ``input`` is a string or a list of role/content messages."""

    model: ModelName
    input: Union[str, Annotated[list[JsonObject], msgspec.Meta(min_length=1, max_length=4096)]]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    stream: bool | None = None
    user: str | None = None


def prompt_text(body: ChatCompletionRequest | CompletionRequest | EmbeddingRequest) -> str:
    """The text a request sends to the model (for estimates and cache keys)."""
    if isinstance(body, ChatCompletionRequest):
        parts = []
        for message in body.messages:
            if isinstance(message.content, str):
                parts.append(message.content)
            elif isinstance(message.content, list):
                parts.extend(str(p.get("text", "")) for p in message.content if isinstance(p, dict))
        return "\n".join(parts)
    if isinstance(body, CompletionRequest):
        return body.prompt if isinstance(body.prompt, str) else "\n".join(body.prompt)
    if isinstance(body, EmbeddingRequest):
        return body.input if isinstance(body.input, str) else "\n".join(body.input)
    return ""
