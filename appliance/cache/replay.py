"""Cached answers in both shapes: a stream's events folded into one response, and a response replayed as SSE.

Entries are stored in the non-streamed shape (``chat.completion`` /
``text_completion``), so a streamed request can hit an answer first produced
without streaming and the other way round. Token log-probabilities travel both
ways too: the chunks' ``logprobs`` are joined when a stream is folded, and a
replay's text chunk carries the whole answer's.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator

import msgspec

from appliance.jsontypes import JsonObject

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.encode
_FINISHED = ("stop", "length", "tool_calls", "function_call", "content_filter")


_ID_PREFIX = secrets.token_hex(6)
_ids = itertools.count(1)


def _new_id(endpoint: str) -> str:
    """Unique per process start and call; cheaper than a urandom read on every hit."""
    return f"{'chatcmpl-' if endpoint == 'chat' else 'cmpl-'}{_ID_PREFIX}{next(_ids):012x}"


def complete_response(endpoint: str, result: object) -> bool:
    """Whether a response is a finished answer worth caching (no error, one choice with a finish reason)."""
    if not isinstance(result, dict) or "error" in result:
        return False
    choices = result.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if choice.get("finish_reason") not in _FINISHED:
        return False
    if endpoint == "chat":
        return isinstance(choice.get("message"), dict)
    return isinstance(choice.get("text"), str)


def usage_tokens(response: JsonObject) -> tuple[int, int]:
    """(prompt tokens, completion tokens) an answer's ``usage`` reports (0 where it says nothing)."""
    usage = response.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def from_stream(endpoint: str, events: list[bytes], usage: JsonObject | None) -> JsonObject | None:
    """Fold SSE events (``data: {...}``, no trailing blank line) into the non-streamed response, or None."""
    head: JsonObject | None = None
    role, finish = "assistant", None
    matched: object = None
    text: list[str] = []
    reasoning: list[str] = []
    tools: dict[int, JsonObject] = {}
    logprobs: JsonObject | None = None
    for event in events:
        if not event.startswith(b"data:"):
            continue
        payload = event[5:].strip()
        if payload == b"[DONE]":
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        if head is None:
            head = chunk
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                return None
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
                matched = choice.get("stop_reason")
            if isinstance(choice.get("logprobs"), dict):
                logprobs = _join_logprobs(logprobs, choice["logprobs"])
            if endpoint != "chat":
                text.append(choice.get("text") or "")
                continue
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            if delta.get("content"):
                text.append(delta["content"])
            if delta.get("reasoning_content"):
                reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or ():
                slot = tools.setdefault(
                    int(call.get("index", 0)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    if head is None or finish not in _FINISHED:
        return None
    usage = dict(usage or {})
    base = {
        "id": head.get("id") or _new_id(endpoint),
        "created": head.get("created") or int(time.time()),
        "model": head.get("model"),
    }
    if head.get("system_fingerprint"):
        base["system_fingerprint"] = head["system_fingerprint"]
    if endpoint == "chat":
        message: JsonObject = {"role": role, "content": "".join(text) if text or not tools else None}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if tools:
            message["tool_calls"] = [tools[i] for i in sorted(tools)]
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": "".join(text), "logprobs": logprobs, "finish_reason": finish}
    if matched is not None:
        choice["stop_reason"] = matched  # the stop string that ended the answer
    if endpoint == "chat":
        return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
    return {**base, "object": "text_completion", "choices": [choice], "usage": usage}


def _join_logprobs(so_far: JsonObject | None, more: JsonObject) -> JsonObject:
    """One answer's ``logprobs`` from its chunks': each list field (``content``; ``tokens``, ``text_offset``, …) runs on."""
    if so_far is None:
        return {name: list(value) if isinstance(value, list) else value for name, value in more.items()}
    for name, value in more.items():
        if isinstance(value, list) and isinstance(so_far.get(name), list):
            so_far[name].extend(value)
    return so_far


class Hit:
    """A cache hit, as the gateway serves it (``x-cache: tier``, similarity for semantic hits)."""

    __slots__ = (
        "tier",
        "similarity",
        "prompt_tokens",
        "completion_tokens",
        "endpoint",
        "response",
        "entry_id",
        "_body",
        "_id",
        "_created",
    )

    def __init__(
        self,
        tier: str,
        endpoint: str,
        response: JsonObject,
        prompt_tokens: int,
        completion_tokens: int,
        similarity: float | None = None,
        entry_id: int | None = None,
    ):
        self.tier = tier
        self.similarity = similarity
        self.endpoint = endpoint
        self.response = response
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.entry_id = entry_id
        self._body: bytes | None = None
        self._id = _new_id(endpoint)
        self._created = int(time.time())

    def _usage(self) -> JsonObject:
        usage = dict(self.response.get("usage") or {})
        usage.setdefault("prompt_tokens", self.prompt_tokens)
        usage.setdefault("completion_tokens", self.completion_tokens)
        usage.setdefault("total_tokens", self.prompt_tokens + self.completion_tokens)
        usage["prompt_tokens_details"] = {**(usage.get("prompt_tokens_details") or {}), "cached_tokens": self.prompt_tokens}
        return usage

    @property
    def body(self) -> bytes:
        """The non-streamed JSON response, with a fresh ``id`` and ``created``."""
        if self._body is None:
            self._body = _encode({**self.response, "id": self._id, "created": self._created, "usage": self._usage()})
        return self._body

    def sse_bytes(self, want_usage: bool) -> bytes:
        """The whole replay as one SSE byte string (chunks, optional usage chunk, ``[DONE]``)."""
        choice = self.response["choices"][0]
        base = {"id": self._id, "created": self._created, "model": self.response.get("model")}
        if self.response.get("system_fingerprint"):
            base["system_fingerprint"] = self.response["system_fingerprint"]
        finish = choice.get("finish_reason") or "stop"
        last: JsonObject = {"logprobs": None, "finish_reason": finish}
        if choice.get("stop_reason") is not None:
            last["stop_reason"] = choice["stop_reason"]
        chunks: list[JsonObject] = []
        if self.endpoint == "chat":
            obj = "chat.completion.chunk"
            message = choice.get("message") or {}
            delta: JsonObject = {"role": message.get("role") or "assistant", "content": message.get("content") or ""}
            if message.get("reasoning_content"):
                delta["reasoning_content"] = message["reasoning_content"]
            chunks.append(
                {
                    **base,
                    "object": obj,
                    "choices": [{"index": 0, "delta": delta, "logprobs": choice.get("logprobs"), "finish_reason": None}],
                }
            )
            if message.get("tool_calls"):
                calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                chunks.append(
                    {
                        **base,
                        "object": obj,
                        "choices": [{"index": 0, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}],
                    }
                )
            chunks.append({**base, "object": obj, "choices": [{"index": 0, "delta": {}, **last}]})
        else:
            obj = "text_completion"
            chunks.append(
                {
                    **base,
                    "object": obj,
                    "choices": [
                        {"index": 0, "text": choice.get("text") or "", "logprobs": choice.get("logprobs"), "finish_reason": None}
                    ],
                }
            )
            chunks.append({**base, "object": obj, "choices": [{"index": 0, "text": "", **last}]})
        if want_usage:
            chunks.append({**base, "object": obj, "choices": [], "usage": self._usage()})
        return b"".join(b"data: " + _encode(c) + b"\n\n" for c in chunks) + DONE

    async def as_sse(self, want_usage: bool) -> AsyncIterator[bytes]:
        """Replay the answer as an SSE stream ending with ``data: [DONE]``."""
        yield self.sse_bytes(want_usage)
