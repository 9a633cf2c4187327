"""Pure translation of a chat completion stream into the Responses API's stream events.

:class:`StreamTranslator` is fed the decoded chat chunks one by one and
returns the Responses events each one causes, numbered by ``sequence_number``:

``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, then for text ``response.content_part.added``,
``response.output_text.delta``…, ``response.output_text.done``,
``response.content_part.done``, or for a function call
``response.function_call_arguments.delta``…, ``response.function_call_arguments.done``, or for a reasoning
model's thinking (chat's ``reasoning_content``) ``response.reasoning_text.delta``…, ``response.reasoning_text.done``;
then ``response.output_item.done``; finally ``response.completed`` (or
``response.incomplete`` after a length stop) carrying the whole response and its
usage. An error chunk ends the stream with ``error`` and ``response.failed``.
"""

from __future__ import annotations

import json

from appliance.jsontypes import JsonObject
from appliance.serving.responses.translate import (
    ResponseHead,
    function_call_item,
    message_item,
    new_id,
    outcome,
    reasoning_item,
    response_object,
    response_usage,
)


def sse(event: JsonObject) -> bytes:
    """One Responses stream event as SSE, named by its type as OpenAI sends it."""
    return b"event: " + event["type"].encode() + b"\ndata: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


class StreamTranslator:
    """The state of one streamed response: the items opened so far and the next sequence number."""

    def __init__(self, head: ResponseHead):
        self.head = head
        self.output: list[JsonObject] = []  # the items, as they stand
        self.model: str | None = None
        self.usage: JsonObject | None = None
        self.finish_reason: str | None = None
        self.failed = False
        self.final: JsonObject | None = None  # the last response object, once the stream is over
        self._sequence = 0
        self._open: int | None = None  # output index of the item receiving deltas
        self._calls: dict[int, int] = {}  # chat tool-call index → output index

    # ------------------------------------------------------------- events
    def _event(self, type_: str, **fields: object) -> JsonObject:
        event = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **fields: object) -> JsonObject:
        return response_object(self.head, status=status, output=[_copy(item) for item in self.output], model=self.model, **fields)  # type: ignore[arg-type]

    def start(self) -> list[JsonObject]:
        """The stream's first events, sent before the engine answers."""
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def feed(self, chunk: JsonObject) -> list[JsonObject]:
        """The events one chat chunk causes (none for a chunk without text, calls or an error)."""
        if isinstance(chunk.get("error"), dict):
            return self.fail(chunk["error"])
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[JsonObject] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[JsonObject]:
        """Close what is open and end the stream with the whole response (``completed`` or ``incomplete``)."""
        events = self._close()
        if not self.output:  # an empty answer is an empty message, as in a plain response
            events += self._open_message()
            events += self._close()
        status, incomplete = outcome(self.finish_reason)
        self.final = self._snapshot(status, usage=response_usage(self.usage), incomplete_details=incomplete)
        events.append(self._event(f"response.{status}", response=self.final))
        return events

    def fail(self, error: JsonObject) -> list[JsonObject]:
        """End the stream on an error: ``error``, then ``response.failed`` with the output so far."""
        self.failed = True
        code = error.get("code") or error.get("type") or "server_error"
        message = error.get("message") or "The engine failed mid-stream."
        self.final = self._snapshot("failed", usage=response_usage(self.usage), error={"code": code, "message": message})
        return [
            self._event("error", code=code, message=message, param=error.get("param")),
            self._event("response.failed", response=self.final),
        ]

    # -------------------------------------------------------------- items
    def _added(self, item: JsonObject) -> JsonObject:
        self.output.append(item)
        self._open = len(self.output) - 1
        announced = _copy(item)
        if announced["type"] in ("message", "reasoning"):
            announced["content"] = []  # a message's part is announced next, by response.content_part.added
        return self._event("response.output_item.added", output_index=self._open, item=announced)

    def _open_message(self) -> list[JsonObject]:
        item = message_item(new_id("msg"), "", status="in_progress")
        added = self._added(item)
        part = dict(item["content"][0])
        return [
            added,
            self._event("response.content_part.added", item_id=item["id"], output_index=self._open, content_index=0, part=part),
        ]

    def _text(self, text: str) -> list[JsonObject]:
        events: list[JsonObject] = []
        if self._open is None or self.output[self._open]["type"] != "message":
            events += self._close()
            events += self._open_message()
        assert self._open is not None
        item = self.output[self._open]
        item["content"][0]["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._open,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _reasoning(self, text: str) -> list[JsonObject]:
        events: list[JsonObject] = []
        if self._open is None or self.output[self._open]["type"] != "reasoning":
            events += self._close()
            events.append(self._added(reasoning_item(new_id("rs"), "", status="in_progress")))
        assert self._open is not None
        item = self.output[self._open]
        item["content"][0]["text"] += text
        events.append(
            self._event("response.reasoning_text.delta", item_id=item["id"], output_index=self._open, content_index=0, delta=text)
        )
        return events

    def _call(self, call: JsonObject) -> list[JsonObject]:
        events: list[JsonObject] = []
        index = int(call.get("index") or 0)
        function = call.get("function") or {}
        if index not in self._calls:
            events += self._close()
            item = function_call_item(
                new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "", "", status="in_progress"
            )
            events.append(self._added(item))
            assert self._open is not None
            self._calls[index] = self._open
        position = self._calls[index]
        item = self.output[position]
        if position != self._open:  # a late delta for a call already closed: keep it, the final item carries it
            item["arguments"] += function.get("arguments") or ""
            return events
        if function.get("name") and not item["name"]:
            item["name"] = function["name"]
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=position,
                    delta=function["arguments"],
                )
            )
        return events

    def _close(self) -> list[JsonObject]:
        """Finish the item receiving deltas, if any."""
        if self._open is None:
            return []
        position, self._open = self._open, None
        item = self.output[position]
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            return [
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=position,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=position, content_index=0, part=dict(part)
                ),
                self._event("response.output_item.done", output_index=position, item=_copy(item)),
            ]
        if item["type"] == "reasoning":
            return [
                self._event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=position,
                    content_index=0,
                    text=item["content"][0]["text"],
                ),
                self._event("response.output_item.done", output_index=position, item=_copy(item)),
            ]
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=position,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=position, item=_copy(item)),
        ]


def _copy(item: JsonObject) -> JsonObject:
    """A deep copy of an item (its content parts are mutated while text streams in)."""
    return json.loads(json.dumps(item))
