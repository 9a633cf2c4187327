"""A chat completion as the Messages API's answer.

``message`` content is a ``text`` block (when the model wrote text) followed by
one ``tool_use`` block per tool call; ``finish_reason`` becomes ``stop_reason``
(``stop`` → ``end_turn``, or ``stop_sequence`` when the engine names the stop
string that ended the answer; ``length`` → ``max_tokens``; ``tool_calls`` →
``tool_use``); usage becomes ``input_tokens`` (the prompt, as metered) and
``output_tokens``.
"""

from __future__ import annotations

import json
import secrets

from appliance.errors import ApplianceError
from appliance.jsontypes import JsonObject, JsonValue

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class MalformedToolCall(ApplianceError):
    """The model called a tool with arguments that are not a JSON object."""

    status = 502
    type = "server_error"
    code = "malformed_tool_call"


def message_id(chat_id: str | None) -> str:
    """``msg_…`` from the chat completion's id (a fresh one when it has none)."""
    tail = (chat_id or "").removeprefix("chatcmpl-")
    return "msg_" + (tail or secrets.token_hex(12))


def tool_use_id(call_id: str | None) -> str:
    return call_id or "toolu_" + secrets.token_hex(12)


def stop_reason(finish_reason: str | None, matched: JsonValue, stop_sequences: list[str] | None) -> tuple[str | None, str | None]:
    """(``stop_reason``, ``stop_sequence``) for a chat ``finish_reason``; ``matched`` is the engine's ``stop_reason``."""
    if finish_reason is None:
        return None, None
    if finish_reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish_reason, "end_turn"), None


def usage(chat_usage: JsonObject | None) -> JsonObject:
    chat_usage = chat_usage or {}
    return {
        "input_tokens": int(chat_usage.get("prompt_tokens") or 0),
        "output_tokens": int(chat_usage.get("completion_tokens") or 0),
    }


def tool_input(arguments: JsonValue) -> JsonObject:
    """A tool call's ``arguments`` (a JSON string, or already an object) as the ``input`` object."""
    if isinstance(arguments, dict):
        return arguments
    if arguments in (None, ""):
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise MalformedToolCall("The model called a tool with arguments that are not a JSON object.")
    return value


def message(result: JsonObject, stop_sequences: list[str] | None = None) -> JsonObject:
    """The Messages API's answer for a chat completion ``result``."""
    choice = (result.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[JsonObject] = []
    text = reply.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = reply.get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.get("id")),
                "name": function.get("name", ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason") or "stop", choice.get("stop_reason"), stop_sequences)
    if calls:
        reason = "tool_use"
    return {
        "id": message_id(result.get("id")),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": result.get("model", ""),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(result.get("usage")),
    }
