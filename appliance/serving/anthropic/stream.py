"""The gateway's chat-completion SSE stream as the Messages API's events, translated as it arrives.

One chat chunk in, zero or more Anthropic events out::

    message_start, ping                      on the first chunk
    content_block_start (text)               on the first text of a run of text
    content_block_delta (text_delta)         for each piece of text
    content_block_start (tool_use)           when a tool call begins (its id and name)
    content_block_delta (input_json_delta)   for each piece of its arguments
    content_block_stop                       when the next block begins, or at the end
    message_delta (stop_reason, usage)       at ``data: [DONE]``, with the usage chunk's tokens
    message_stop

An error event from the engine or the gateway (``data: {"error": …}``) becomes an
``error`` event, after which nothing else is sent.
"""

from __future__ import annotations

import json

from appliance.jsontypes import JsonObject
from appliance.serving.anthropic.errors import from_openai
from appliance.serving.anthropic.response import message_id, stop_reason, tool_use_id, usage

_DONE = b"[DONE]"


def event(name: str, payload: JsonObject) -> bytes:
    """One server-sent event with its ``event:`` line, as Anthropic sends them."""
    return (
        b"event: "
        + name.encode()
        + b"\ndata: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


class StreamTranslator:
    """Feeds on chat SSE bytes (any split), returns Anthropic SSE bytes."""

    def __init__(self, model: str, stop_sequences: list[str] | None = None):
        self._model = model
        self._stops = stop_sequences
        self._buffer = b""
        self._started = False
        self._over = False
        self._blocks = 0  # content blocks started so far (the next block's index)
        self._open: str | None = None  # "text" or "tool_use": the kind of the block now open
        self._tools: dict[int, int] = {}  # the chat tool-call index → its block index
        self._finish: str | None = None
        self._matched: object = None
        self._usage: JsonObject | None = None
        self._tool_called = False

    @property
    def over(self) -> bool:
        """Whether the message ended (``message_stop`` or ``error`` sent)."""
        return self._over

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n\n")
        return b"".join(self._translate(raw) for raw in complete)

    # ------------------------------------------------------------------ events
    def _translate(self, raw: bytes) -> bytes:
        if self._over:
            return b""
        payload = b"".join(line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:"))
        if not payload:
            return b""
        if payload == _DONE:
            return self._end()
        chunk = json.loads(payload)
        if "error" in chunk:
            self._over = True
            return event("error", from_openai(chunk))
        out = self._start(chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            for call in delta.get("tool_calls") or []:
                out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return out

    def _start(self, chunk: JsonObject) -> bytes:
        if self._started:
            return b""
        self._started = True
        self._model = chunk.get("model") or self._model
        start: JsonObject = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"type": "message_start", "message": start}) + event("ping", {"type": "ping"})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self._blocks - 1})

    def _open_block(self, kind: str, block: JsonObject) -> bytes:
        out = self._close()
        self._open = kind
        self._blocks += 1
        return out + event(
            "content_block_start", {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}
        )

    def _text(self, text: str) -> bytes:
        out = b"" if self._open == "text" else self._open_block("text", {"type": "text", "text": ""})
        return out + event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._blocks - 1, "delta": {"type": "text_delta", "text": text}},
        )

    def _tool_call(self, call: JsonObject) -> bytes:
        self._tool_called = True
        position = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if position not in self._tools:
            out = self._open_block(
                "tool_use",
                {"type": "tool_use", "id": tool_use_id(call.get("id")), "name": function.get("name") or "", "input": {}},
            )
            self._tools[position] = self._blocks - 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._tools[position],
                    "delta": {"type": "input_json_delta", "partial_json": arguments},
                },
            )
        return out

    def _end(self) -> bytes:
        self._over = True
        out = self._start({}) + self._close()
        reason, sequence = stop_reason(self._finish or "stop", self._matched, self._stops)
        if self._tool_called:
            reason = "tool_use"
        counts = usage(self._usage)
        out += event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"input_tokens": counts["input_tokens"], "output_tokens": counts["output_tokens"]},
            },
        )
        return out + event("message_stop", {"type": "message_stop"})
