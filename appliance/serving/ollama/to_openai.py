"""Ollama's requests as the internal (OpenAI-shaped) ones. Pure: no I/O.

Requests become :mod:`appliance.openai_schema` bodies, so an Ollama request is
authenticated, admitted, cached, routed and metered by the same gateway as every
other. What the engines cannot honour (images, templates, non-neutral options
they lack) is refused with a 400 that names the field.
"""

from __future__ import annotations

import json

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    EmbeddingRequest,
    ResponseFormat,
    StreamOptions,
)
from appliance.serving.ollama.schema import (
    NEUTRAL_OPTIONS,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    Format,
    GenerateRequest,
    Message,
    Options,
    Think,
    ToolCall,
)
from appliance.serving.schema_limits import check_schema


def _refuse(param: str, message: str) -> BadRequest:
    return BadRequest(message, param=param)


def sampling(options: Options | None) -> JsonObject:
    """The OpenAI sampling fields ``options`` asks for (``num_predict`` → ``max_tokens``; -1, -2 and 0: no cap)."""
    if options is None:
        return {}
    for name, neutral in NEUTRAL_OPTIONS.items():
        value = getattr(options, name)
        if value is not None and value != neutral:
            raise _refuse(f"options.{name}", f"options.{name} is not supported by the engines; leave it unset or {neutral:g}.")
    out: JsonObject = {
        name: getattr(options, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
        )
        if getattr(options, name) is not None
    }
    if options.num_predict is not None and options.num_predict > 0:
        out["max_tokens"] = options.num_predict
    return out


def response_format(fmt: Format) -> ResponseFormat | None:
    """``format``: "json" → any JSON object; a JSON schema → output constrained to it; "" or absent → free text."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat(type="json_object")
    check_schema(fmt, "format")
    return ResponseFormat(type="json_schema", json_schema={"name": "format", "schema": fmt, "strict": True})


def template_kwargs(think: Think) -> JsonObject | None:
    """``think`` as the chat-template switch thinking models read (``enable_thinking``, ``reasoning_effort``)."""
    if think is None:
        return None
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return {"enable_thinking": True, "reasoning_effort": think}


def _usage_option(stream: bool) -> StreamOptions | None:
    """A stream asks for its usage event: the final object's counts come from it."""
    return StreamOptions(include_usage=True) if stream else None


def _refuse_common(body: ChatRequest | GenerateRequest) -> None:
    if body.logprobs:
        raise _refuse("logprobs", "logprobs are not supported on the Ollama API; leave logprobs unset or false.")
    if body.top_logprobs:
        raise _refuse("top_logprobs", "top_logprobs is not supported on the Ollama API; leave it unset or 0.")


def _openai_tool_calls(calls: list[ToolCall], first: int) -> list[JsonObject]:
    return [
        {
            "id": call.id or f"call_{first + i}",
            "type": "function",
            "function": {"name": call.function.name, "arguments": json.dumps(call.function.arguments)},
        }
        for i, call in enumerate(calls)
    ]


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """Ollama messages as OpenAI ones: tool calls get ids, and each tool answer the id of the call it answers."""
    out: list[ChatMessage] = []
    unanswered: list[tuple[str, str]] = []  # (id, function name) of calls not yet answered, in order
    issued = 0
    for message in messages:
        if message.images:
            raise _refuse("images", "images are not supported: the appliance serves text models only.")
        if message.role == "assistant" and message.tool_calls:
            calls = _openai_tool_calls(message.tool_calls, issued)
            issued += len(calls)
            unanswered += [(c["id"], c["function"]["name"]) for c in calls]
            out.append(ChatMessage(role="assistant", content=message.content or None, tool_calls=calls))
        elif message.role == "tool":
            call_id = message.tool_call_id
            if call_id is None:
                match = next((c for c in unanswered if c[1] == message.tool_name), unanswered[0] if unanswered else None)
                call_id = match[0] if match else f"call_{issued}"
            unanswered = [c for c in unanswered if c[0] != call_id]
            out.append(ChatMessage(role="tool", content=message.content, tool_call_id=call_id, name=message.tool_name))
        else:
            out.append(ChatMessage(role=message.role, content=message.content))
    return out


def chat_request(body: ChatRequest) -> ChatCompletionRequest:
    """``/api/chat`` as an OpenAI chat completion (streamed unless ``stream`` is false, as Ollama's default)."""
    _refuse_common(body)
    return ChatCompletionRequest(
        model=body.model,
        messages=chat_messages(body.messages),
        response_format=response_format(body.format),
        tools=body.tools or None,
        stream=body.stream is not False,
        stream_options=_usage_option(body.stream is not False),
        chat_template_kwargs=template_kwargs(body.think),
        **sampling(body.options),
    )


def generate_request(body: GenerateRequest) -> ChatCompletionRequest | CompletionRequest:
    """``/api/generate``: a chat turn with the model's template, or with ``raw`` a plain completion of the prompt."""
    _refuse_common(body)
    if body.images:
        raise _refuse("images", "images are not supported: the appliance serves text models only.")
    if body.template:
        raise _refuse(
            "template",
            "template is not supported: the model's own chat template is used; "
            "format the prompt yourself and send it with raw: true.",
        )
    if body.suffix:
        raise _refuse("suffix", "suffix (fill-in-the-middle) is not supported; leave it unset or empty.")
    if body.context:
        raise _refuse("context", "context (the tokens of an earlier answer) is not supported; use /api/chat with the messages.")
    options = sampling(body.options)
    stream = body.stream is not False
    if body.raw:
        if body.system:
            raise _refuse("system", "system cannot be combined with raw: a raw prompt is sent as it is.")
        if body.think:
            raise _refuse("think", "think cannot be combined with raw: a raw prompt is sent without the chat template.")
        completion = CompletionRequest(
            model=body.model,
            prompt=body.prompt or "",
            response_format=response_format(body.format),
            stream=stream,
            stream_options=_usage_option(stream),
            **options,
        )
        if "max_tokens" not in options:
            completion.max_tokens = None  # Ollama generates until the end of text, not OpenAI's 16 tokens
        return completion
    messages = [ChatMessage(role="system", content=body.system)] if body.system else []
    messages.append(ChatMessage(role="user", content=body.prompt or ""))
    return ChatCompletionRequest(
        model=body.model,
        messages=messages,
        response_format=response_format(body.format),
        stream=stream,
        stream_options=_usage_option(stream),
        chat_template_kwargs=template_kwargs(body.think),
        **options,
    )


def embed_request(body: EmbedRequest | EmbeddingsRequest) -> EmbeddingRequest:
    """``/api/embed`` (``input``) or the older ``/api/embeddings`` (``prompt``) as an OpenAI embedding request."""
    if isinstance(body, EmbedRequest):
        if body.dimensions is not None:
            raise _refuse("dimensions", "dimensions is not supported: embeddings come in the model's own size; leave it unset.")
        return EmbeddingRequest(model=body.model, input=body.input)
    return EmbeddingRequest(model=body.model, input=body.prompt)
