"""The API's request class: JSON bodies nested past a fixed depth, or of the wrong JSON types, are refused with a clear 400.

msgspec decodes recursively, so a body nested 10,000 levels deep raised
RecursionError (a 500), and one nested a few hundred levels deep reached the
recursive code behind it (schema-to-grammar conversion, cache keys). The depth
is measured on the raw bytes before decoding: strings are cut out, the rest is
reduced to its brackets, and the scan stops at the first level past the limit.

Litestar converts a decoded body into the route's body type leniently (``1``
becomes ``true``, ``"5"`` becomes ``5``), so a client that sends the wrong type
is quietly answered as if it had sent another value. A route whose body is a
msgspec struct has its JSON checked against that type strictly first: a value of
the wrong JSON type is a 400 naming its place in the body.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncGenerator
from itertools import accumulate
from typing import cast

import msgspec
from litestar import Request
from litestar.response import Stream
from litestar.types import Empty

from appliance.api.request_trace import note_model
from appliance.errors import BadRequest
from appliance.jsontypes import JsonValue

MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_THREAD_ABOVE = 1 << 20


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``body`` nests arrays/objects more than ``limit`` levels."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    return any(depth > limit for depth in accumulate(map(_STEP.__getitem__, brackets)))


class ApplianceRequest(Request):
    """Litestar's request, with the JSON depth limit applied before decoding."""

    async def json(self) -> JsonValue:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            deep = await asyncio.to_thread(json_too_deep, body) if len(body) > _THREAD_ABOVE else json_too_deep(body)
            if deep:
                raise BadRequest(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.", code="json_too_deep")
            data = await super().json()
            note_model(self.scope, data)  # the request log's model, read once here
            _check_types(self, data)
            return data
        return await super().json()


def _body_type(request: Request) -> type | None:
    """The msgspec struct the route takes as its body, if it takes one."""
    handler = request.scope.get("route_handler")
    parameter = handler.parsed_fn_signature.parameters.get("data") if handler is not None else None
    annotation = parameter.annotation if parameter is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct) else None


def _check_types(request: Request, data: JsonValue) -> None:
    body_type = _body_type(request)
    if body_type is None:
        return
    try:
        msgspec.convert(data, body_type, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        where = message.rpartition(" - at `$")[2].rstrip("`") if " - at `$" in message else ""
        param = where.lstrip(".") or None
        if message.startswith("Expected `") and "`, got `" in message:  # a wrong JSON type; the lenient pass answers the rest
            raise BadRequest(f"Invalid request body: {message}", param=param) from None


def stream_source(response: Stream) -> AsyncGenerator[bytes | str, None]:
    """The async generator behind one of the gateway's streamed answers, for an API that re-encodes it.

    Litestar types ``Stream.iterator`` as any iterable; the gateway always streams from an async
    generator, which the translators close to settle the request.
    """
    source = response.iterator
    if not inspect.isasyncgen(source):
        raise TypeError(f"expected the gateway's async generator, got {type(source).__name__}")
    return cast("AsyncGenerator[bytes | str, None]", source)  # checked above; its items are the gateway's bytes
