"""Helpers for the response-cache tests: a migrated SQLite database, principals, requests and answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from appliance.accounts.keys import Principal
from appliance.cache.responses import ResponseCache
from appliance.db import engine as dbmod
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest
from appliance.settings import Settings

MODEL = "tiny:q8_0"


def make_cache(tmp_path: Path, embedder: Any = None, **settings: Any) -> ResponseCache:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    s = Settings(data_dir=data, seed_default_model=False, **{"semantic_cache_enabled": True, **settings})
    if not s.db_path.exists():
        dbmod.migrate(s.db_path)
    return ResponseCache(s, dbmod.make_engine(s.db_path), embedder)


def principal(key_id: int = 1, team_id: int | None = None, policy: dict | None = None) -> Principal:
    return Principal(kind="key", id=key_id, name=f"ak_{key_id:09d}", role="user", team_id=team_id, cache_policy=policy)


def chat(text: str = "What is the capital of France?", system: str | None = None, **fields: Any) -> ChatCompletionRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return msgspec.convert({"model": "tiny", "messages": messages, "temperature": 0, **fields}, ChatCompletionRequest)


def completion(prompt: str = "Once upon a time", **fields: Any) -> CompletionRequest:
    return msgspec.convert({"model": "tiny", "prompt": prompt, "temperature": 0, **fields}, CompletionRequest)


def chat_result(content: str = "Paris.", prompt_tokens: int = 9, completion_tokens: int = 2, finish: str = "stop") -> dict:
    return {
        "id": "chatcmpl-engine",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None, "finish_reason": finish}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def completion_result(text: str = " there was a cat.", prompt_tokens: int = 4, completion_tokens: int = 5) -> dict:
    return {
        "id": "cmpl-engine",
        "object": "text_completion",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chat_events(pieces: list[str], finish: str | None = "stop") -> list[bytes]:
    """SSE events as the gateway collects them: `data: {...}` without the blank line, no usage, no [DONE]."""
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    if finish:
        events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return [b"data: " + msgspec.json.encode(e) for e in events]


def completion_events(pieces: list[str], finish: str | None = "length") -> list[bytes]:
    base = {"id": "cmpl-s", "object": "text_completion", "created": 1, "model": MODEL}
    events = [{**base, "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}]} for p in pieces]
    if finish:
        events.append({**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}]})
    return [b"data: " + msgspec.json.encode(e) for e in events]


async def collect(stream: Any) -> bytes:
    return b"".join([chunk async for chunk in stream])


def sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]
