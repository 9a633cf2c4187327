"""The engine's OpenAI answers as Ollama's objects. Pure: no I/O.

A whole answer becomes one object with ``done: true`` and the counts and
durations (nanoseconds, :class:`Timings`) Ollama reports; the same final
object ends a stream (:mod:`appliance.serving.ollama.streams`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from appliance.jsontypes import JsonObject

_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


def now_rfc3339() -> str:
    """Ollama's ``created_at``: UTC, RFC 3339 with a ``Z``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


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


def final_object(model: str, usage: JsonObject, finish_reason: str | None, timings: Timings) -> JsonObject:
    """The fields of the object that ends an answer: ``done: true``, why it ended, its token counts and durations."""
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


def chat_message(content: str, thinking: str | None = None, tool_calls: list[JsonObject] | None = None) -> JsonObject:
    """An assistant ``message`` of ``/api/chat``: thinking and tool calls only when there are some."""
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
    body = final_object(model, result.get("usage") or {}, choice.get("finish_reason"), timings)
    return {
        "model": model,
        "created_at": body.pop("created_at"),
        "message": chat_message(message.get("content") or "", thinking, message.get("tool_calls")),
        **body,
    }


def generate_answer(result: JsonObject, model: str, timings: Timings) -> JsonObject:
    """An OpenAI chat completion or completion as Ollama's ``/api/generate`` answer."""
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message")
    text = (message.get("content") or "") if isinstance(message, dict) else (choice.get("text") or "")
    body = final_object(model, result.get("usage") or {}, choice.get("finish_reason"), timings)
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
