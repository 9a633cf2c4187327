"""The worker's HTTP plumbing: JSON answers, bounded request bodies, and request preparation off the loop.

The worker's app (:mod:`.worker`) is raw ASGI; these are the few helpers its routes share.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .errors import PayloadTooLarge
from .sequence import Sequence

MAX_BODY = 32 * 1024 * 1024
#: Longest a request's preparation (grammar conversion, template, tokenising) may take, in seconds.
PREPARE_TIMEOUT = 10.0
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
#: ASGI's callables as uvicorn hands them to the app; messages are plain dicts.
Receive: TypeAlias = Callable[[], Awaitable[JsonObject]]
Send: TypeAlias = Callable[[JsonObject], Awaitable[None]]


async def send_json(send: Send, status: int, obj: JsonObject) -> None:
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def off_loop(fn, *args, param: str | None = None):
    """Run request preparation in a thread so the HTTP loop keeps serving others.

    libllama's tokenizer and grammar parser release the GIL (ctypes), so a 10 MB
    prompt or a large grammar costs its own request time, not everyone's. Past
    :data:`PREPARE_TIMEOUT` the request gets a 400 (the thread finishes on its own).
    """
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, fn, *args)
    try:
        return await asyncio.wait_for(asyncio.shield(fut), PREPARE_TIMEOUT)
    except TimeoutError:
        fut.add_done_callback(discard)
        raise BadRequest(f"the request took more than {PREPARE_TIMEOUT:g} s to prepare", param=param) from None


def discard(fut: asyncio.Future) -> None:
    """Free the samplers of a sequence prepared after its request gave up."""
    if fut.cancelled() or fut.exception() is not None:
        return
    seq = fut.result()
    if isinstance(seq, Sequence):
        seq.free_samplers()


async def read_json(receive: Receive) -> JsonValue:
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionAbortedError
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise PayloadTooLarge("the request body is too large")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            break
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
