"""The engine's SSE events for one request as Ollama's NDJSON stream. Pure: no I/O.

One JSON object per line: the text (or thinking) of each event as it comes, the
tool calls gathered from their parts at the end, then the final object with
``done: true`` and the counts and durations Ollama reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from appliance.jsontypes import JsonObject
from appliance.serving.ollama.answers import Timings, chat_message, final_object, now_rfc3339


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
            out["message"] = chat_message(text, thinking, tool_calls)
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
        final = final_object(self.model, self.usage, self.finish_reason, timings)
        if self.chat:
            final = {"model": self.model, "created_at": final.pop("created_at"), "message": chat_message(""), **final}
        else:
            final = {"model": self.model, "created_at": final.pop("created_at"), "response": "", **final}
        out.append(final)
        return out
