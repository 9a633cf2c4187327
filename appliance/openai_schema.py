"""Request bodies of the OpenAI-compatible API, in the order of OpenAI's reference.

Fields after the ``# --- extensions`` marker are not OpenAI's; they follow
llama.cpp and vLLM (``top_k``, ``min_p``, ``repeat_penalty``, ``ignore_eos``,
``chat_template_kwargs``). Structs are re-encoded with ``omit_defaults`` when
forwarded, so unset fields are never sent to engines.

Nothing a client sends is dropped in silence. A request body names only
fields that change the answer and are served, fields that are harmless to
ignore (:data:`IGNORED`: accepted, kept out of cache keys, never forwarded),
and fields declared only so that a value that would change the answer is
refused (:data:`REFUSED`: ``best_of: 3`` gets a 400 naming ``best_of``,
``best_of: 1`` is fine). Any other field is refused by msgspec as
unknown, and the error handler names it as the ``param``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
CompletionTokens = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Stop = (
    Annotated[str, msgspec.Meta(max_length=500)]
    | Annotated[list[Annotated[str, msgspec.Meta(max_length=500)]], msgspec.Meta(max_length=16)]
    | None
)


COMPLETION_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI and vLLM
#: How a check across fields names its field: msgspec's " - at `$.field`" suffix, which the error handler reads as ``param``.
_AT = " - at `$."


class _Base(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class _Request(_Base, forbid_unknown_fields=True):
    """A top-level request body: an unknown field is a 400, not a silent drop."""


#: Accepted and ignored: they cannot change the answer (OpenAI's bookkeeping and routing hints).
IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key", "safety_identifier")

#: Declared so that only their harmless values pass; the message a client gets for any other value.
REFUSED = {
    "suffix": "suffix (fill-in-the-middle) is not supported; leave it unset or empty.",
    "best_of": "best_of above 1 is not supported.",
    "dimensions": "dimensions is not supported: embeddings come in the model's own size; leave it unset.",
    "modalities": 'Only text output is supported: leave modalities unset or ["text"].',
}

#: Never sent to engines nor part of cache keys: the ignored fields, and the refused ones, whose values
#: that pass validation (false, 0, empty, ["text"]) ask for what the engines do anyway.
NOT_FORWARDED = IGNORED + tuple(REFUSED)

Metadata = Annotated[dict[str, Annotated[str, msgspec.Meta(max_length=512)]], msgspec.Meta(max_length=16)] | None
Hint = Annotated[str, msgspec.Meta(max_length=512)] | None


class StreamOptions(_Base):
    include_usage: bool | None = None


class ResponseFormat(_Base):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonObject | None = None


class FunctionName(_Base):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class NamedToolChoice(_Base):
    """``{"type": "function", "function": {"name": ...}}``: the model must call this function."""

    type: Literal["function"]
    function: FunctionName


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[JsonObject] | None = None
    name: str | None = None
    tool_calls: list[JsonObject] | None = None
    tool_call_id: str | None = None


class _Generation(_Request):
    """The fields of every generating request that are accepted and ignored (:data:`IGNORED`)."""

    user: Hint = None
    metadata: Metadata = None
    store: bool | None = None
    service_tier: Hint = None
    prompt_cache_key: Hint = None
    safety_identifier: Hint = None


class ChatCompletionRequest(_Generation, kw_only=True):
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
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    tools: list[JsonObject] | None = None
    top_p: Probability | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    modalities: list[Literal["text"]] | None = None
    parallel_tool_calls: bool | None = None  # ignored (IGNORED)
    # --- extensions (llama.cpp / vLLM)
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    min_p: Probability | None = None
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] | None = None
    chat_template_kwargs: JsonObject | None = None
    ignore_eos: bool | None = None

    def __post_init__(self) -> None:
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs needs logprobs: true{_AT}top_logprobs`")


class CompletionRequest(_Generation, kw_only=True):
    model: ModelName
    prompt: Annotated[str, msgspec.Meta(min_length=0)] | Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None
    max_tokens: CompletionTokens | None = None  # 0 only with echo: the prompt scored, nothing generated
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    presence_penalty: Penalty | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    suffix: Annotated[str, msgspec.Meta(max_length=0)] | None = None
    best_of: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    # --- extensions (llama.cpp / vLLM)
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    min_p: Probability | None = None
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] | None = None
    response_format: ResponseFormat | None = None
    ignore_eos: bool | None = None

    def __post_init__(self) -> None:
        # OpenAI and vLLM default a completion to 16 tokens; set it here so it is forwarded and reserved
        if self.max_tokens is None:
            self.max_tokens = COMPLETION_DEFAULT_MAX_TOKENS
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(f"max_tokens may be 0 only with echo (to score a prompt){_AT}max_tokens`")


class EmbeddingRequest(_Request):
    input: Annotated[str, msgspec.Meta(max_length=1000000)] | Annotated[list[str], msgspec.Meta(min_length=1, max_length=2048)]
    model: ModelName
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: None = None
    user: Hint = None


class ResponsesRequest(_Generation, kw_only=True):
    """``/v1/responses``: ``input`` is a string or a list of items (messages with text parts, function calls and
    their outputs). Items, ``tools``, ``tool_choice`` and ``text`` are checked where they are translated to a chat
    request (``appliance.serving.responses.translate``), which names the field of any value it cannot serve."""

    model: ModelName
    input: str | Annotated[list[JsonObject], msgspec.Meta(min_length=1, max_length=4096)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    stream: bool | None = None
    tools: Annotated[list[JsonObject], msgspec.Meta(max_length=128)] | None = None
    tool_choice: Literal["auto", "none", "required"] | JsonObject | None = None
    previous_response_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    text: JsonObject | None = None
    parallel_tool_calls: bool | None = None  # ignored (IGNORED)


def with_tool_choice_settled(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """``body`` with its ``tool_choice`` checked and in the form the engines take, whichever API it came in by.

    ``auto`` is what the engines do with tools and no ``tool_choice``; ``none`` keeps the
    tools out of the prompt. A forced choice (``required``, a named function) needs the
    tools it names, and no ``response_format`` beside it (one grammar per answer): else a
    400 naming ``tool_choice``.
    """
    choice = body.tool_choice
    if choice is None:
        return body
    if choice == "none":
        return msgspec.structs.replace(body, tools=None, tool_choice=None)
    if choice == "auto":
        return msgspec.structs.replace(body, tool_choice=None)
    functions = [t.get("function") for t in body.tools or []]
    names = {f["name"] for f in functions if isinstance(f, dict) and isinstance(f.get("name"), str)}
    if not names:
        raise BadRequest('tool_choice "required" or a named function needs tools', param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise BadRequest(f"tool_choice names the function {choice.function.name!r}, which is not in tools", param="tool_choice")
    if body.response_format is not None and body.response_format.type != "text":
        raise BadRequest("a forced tool_choice cannot be combined with response_format", param="tool_choice")
    return body


def for_engine(body: _Base, **changes: object) -> _Base:
    """``body`` with ``changes``, less the fields engines are never sent (:data:`NOT_FORWARDED`), in one copy."""
    cleared = {name: None for name in NOT_FORWARDED if getattr(body, name, None) is not None}
    return msgspec.structs.replace(body, **cleared, **changes)


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
