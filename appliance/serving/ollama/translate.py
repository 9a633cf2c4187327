"""Ollama's request and answer shapes to and from the internal (OpenAI-shaped) ones. Pure: no I/O.

Requests become :mod:`appliance.openai_schema` bodies, so an Ollama request is
authenticated, admitted, cached, routed and metered by the same gateway as every
other. Answers come back as the engine's OpenAI JSON (or its SSE events) and are
rewritten here into Ollama's objects: one JSON object per line when streamed
(:class:`StreamTranslator`), the last one with ``done: true`` and the counts
and durations (nanoseconds) Ollama reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

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

_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


def now_rfc3339() -> str:
    """Ollama's ``created_at``: UTC, RFC 3339 with a ``Z``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# ----------------------------------------------------------------- requests
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


# ------------------------------------------------------------------ answers
@dataclass(frozen=True)
class Timings:
    """Nanoseconds, as Ollama reports them: the whole request, the prompt (to the first token) and the generation."""

    total: int
    prompt: int = 0
    generation: int = 0


def _arguments(text: object) -> object:
    if not isinstance(text, str):
        return text if text is not None else {}
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: handed back as the model wrote it


def ollama_tool_calls(calls: list[JsonObject] | None) -> list[JsonObject]:
    """OpenAI ``tool_calls`` (arguments as a JSON string) as Ollama's (arguments as an object)."""
    out = []
    for index, call in enumerate(calls or []):
        function = call.get("function") or {}
        out.append(
            {
                "id": call.get("id"),
                "function": {
                    "index": index,
                    "name": function.get("name", ""),
                    "arguments": _arguments(function.get("arguments")),
                },
            }
        )
    return out


def _final(model: str, usage: JsonObject, finish_reason: str | None, timings: Timings) -> JsonObject:
    return {
        "model": model,
        "created_at": now_rfc3339(),
        "done": True,
        "done_reason": _DONE_REASONS.get(finish_reason or "stop", "stop"),
        "total_duration": timings.total,
        "load_duration": 0,
        "prompt_eval_count": int(usage.get("prompt_tokens") or 0),
        "prompt_eval_duration": timings.prompt,
        "eval_count": int(usage.get("completion_tokens") or 0),
        "eval_duration": timings.generation,
    }


def _chat_message(content: str, thinking: str | None = None, tool_calls: list[JsonObject] | None = None) -> JsonObject:
    message: JsonObject = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = ollama_tool_calls(tool_calls)
    return message


def chat_answer(result: JsonObject, model: str, timings: Timings) -> JsonObject:
    """An OpenAI chat completion as Ollama's ``/api/chat`` answer."""
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    thinking = message.get("reasoning_content") or message.get("reasoning")
    body = _final(model, result.get("usage") or {}, choice.get("finish_reason"), timings)
    return {
        "model": model,
        "created_at": body.pop("created_at"),
        "message": _chat_message(message.get("content") or "", thinking, message.get("tool_calls")),
        **body,
    }


def generate_answer(result: JsonObject, model: str, timings: Timings) -> JsonObject:
    """An OpenAI chat completion or completion as Ollama's ``/api/generate`` answer."""
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message")
    text = (message.get("content") or "") if isinstance(message, dict) else (choice.get("text") or "")
    body = _final(model, result.get("usage") or {}, choice.get("finish_reason"), timings)
    out: JsonObject = {"model": model, "created_at": body.pop("created_at"), "response": text}
    thinking = (message.get("reasoning_content") or message.get("reasoning")) if isinstance(message, dict) else None
    if thinking:
        out["thinking"] = thinking
    return {**out, **body}


def embed_answer(result: JsonObject, model: str, timings: Timings) -> JsonObject:
    """An OpenAI embedding list as ``/api/embed``'s answer."""
    data = sorted(result.get("data") or [], key=lambda item: item.get("index", 0))
    return {
        "model": model,
        "embeddings": [item.get("embedding") for item in data],
        "total_duration": timings.total,
        "load_duration": 0,
        "prompt_eval_count": int((result.get("usage") or {}).get("prompt_tokens") or 0),
    }


def embeddings_answer(result: JsonObject) -> JsonObject:
    """An OpenAI embedding list as the older ``/api/embeddings`` answer (one vector)."""
    first: JsonObject = next((item for item in result.get("data") or [] if item.get("index", 0) == 0), {})
    return {"embedding": first.get("embedding") or []}


# ------------------------------------------------------------------ streams
@dataclass
class _ToolCallParts:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class StreamTranslator:
    """The engine's SSE events for one request → Ollama's NDJSON objects.

    ``chat`` picks ``message`` objects (``/api/chat``) or ``response`` text
    (``/api/generate``, whose engine request is a chat turn, or a completion
    with ``raw``). Times are ``time.perf_counter_ns()`` readings: the
    request's start is given, the first token's and the end's are read by the
    caller and passed in, so the translator stays pure.
    """

    model: str
    chat: bool
    started_ns: int
    first_token_ns: int | None = None
    finish_reason: str | None = None
    usage: JsonObject = field(default_factory=dict)
    failed: bool = False
    _tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)

    def event(self, data: bytes, now_ns: int) -> list[JsonObject]:
        """One SSE event (``data: {...}``) → the objects to send now (none for usage or ``[DONE]``)."""
        payload = data.removeprefix(b"data:").strip()
        if not payload or payload == b"[DONE]":
            return []
        chunk = json.loads(payload)
        if "error" in chunk:
            self.failed = True
            error = chunk["error"]
            return [{"error": error.get("message", "engine error") if isinstance(error, dict) else str(error)}]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out = []
        for choice in chunk.get("choices") or []:
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")  # a chat chunk, or a completion's
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            for call in delta.get("tool_calls") or []:
                self._add_tool_call_part(call)
            if text or thinking:
                if self.first_token_ns is None:
                    self.first_token_ns = now_ns
                out.append(self._piece(text or "", thinking))
        return out

    def _add_tool_call_part(self, call: JsonObject) -> None:
        parts = self._tool_calls.setdefault(int(call.get("index") or 0), _ToolCallParts())
        parts.id = call.get("id") or parts.id
        function = call.get("function") or {}
        parts.name += function.get("name") or ""
        parts.arguments += function.get("arguments") or ""

    def _piece(self, text: str, thinking: str | None = None, tool_calls: list[JsonObject] | None = None) -> JsonObject:
        out: JsonObject = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            out["message"] = _chat_message(text, thinking, tool_calls)
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def finish(self, now_ns: int) -> list[JsonObject]:
        """The objects that end the stream: the tool calls, if any, then the final one with ``done: true``."""
        if self.failed:
            return []
        out = []
        if self._tool_calls:
            calls = [
                {"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
                for _, p in sorted(self._tool_calls.items())
            ]
            out.append(self._piece("", tool_calls=calls))
        first = self.first_token_ns if self.first_token_ns is not None else now_ns
        timings = Timings(total=now_ns - self.started_ns, prompt=first - self.started_ns, generation=now_ns - first)
        final = _final(self.model, self.usage, self.finish_reason, timings)
        if self.chat:
            final = {"model": self.model, "created_at": final.pop("created_at"), "message": _chat_message(""), **final}
        else:
            final = {"model": self.model, "created_at": final.pop("created_at"), "response": "", **final}
        out.append(final)
        return out
