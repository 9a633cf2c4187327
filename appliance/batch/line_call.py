"""One batch line through the gateway, as if it had arrived over HTTP from the batch's key.

The gateway is handed a request built for the line (no headers, a connection that never hangs up) and the batch
key's principal at ``batch`` priority; it admits, looks in the cache, routes, forwards and settles exactly as for
a client. Whatever it answers or raises becomes the line's :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass

import msgspec
from litestar import Request
from litestar.types import Message

from appliance.accounts.keys import Principal
from appliance.batch.lines import ENDPOINTS, RequestLine, decode_body
from appliance.errors import ApplianceError, EngineUnavailable, QuotaExceeded, RateLimited, error_envelope
from appliance.serving.engine_errors import EngineAnswerError
from appliance.serving.gateway import Gateway

log = logging.getLogger("appliance.batch.line_call")


@dataclass(frozen=True)
class Outcome:
    status_code: int
    body: dict
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code == 200


class TryLater(Exception):
    """The box was busy (queue full, slot wait timed out, engine restarting, a rate limit): run the line later."""

    def __init__(self, delay_s: float):
        super().__init__(f"retry in {delay_s:g} s")
        self.delay_s = delay_s


async def _never_disconnects() -> Message:
    await asyncio.get_running_loop().create_future()  # a batch line has no client to leave
    raise AssertionError("unreachable")


def line_request(url: str) -> Request:
    scope = {"type": "http", "method": "POST", "path": url, "raw_path": url.encode(), "query_string": b"", "headers": []}
    return Request(scope, receive=_never_disconnects)  # type: ignore[arg-type]


def _retry_after(exc: ApplianceError, default: float) -> float:
    try:
        return min(30.0, max(0.2, float(exc.headers.get("Retry-After", default))))
    except ValueError:
        return default


def _failure(exc: ApplianceError) -> Outcome:
    return Outcome(exc.status, error_envelope(exc.message, exc.type, exc.param, exc.code))


async def call_line(gateway: Gateway, principal: Principal, line: RequestLine) -> Outcome:
    """Run ``line`` for ``principal`` through ``gateway``; :class:`TryLater` when only a busy box said no."""
    endpoint, _ = ENDPOINTS[line.url]
    try:
        body = decode_body(line.url, line.body)
    except msgspec.ValidationError as exc:
        return Outcome(400, error_envelope(str(exc), "invalid_request_error", None, "invalid_request"))
    batch_principal = dataclasses.replace(principal, priority="batch")
    try:
        response = await gateway.handle(line_request(line.url), batch_principal, endpoint, body)  # type: ignore[arg-type]
    except QuotaExceeded as exc:
        return _failure(exc)
    except RateLimited as exc:  # a rate limit or a full queue: the line waits, it does not fail
        raise TryLater(_retry_after(exc, 1.0)) from None
    except EngineUnavailable as exc:  # a slot wait timed out or the engine is restarting
        raise TryLater(_retry_after(exc, 2.0)) from None
    except EngineAnswerError as exc:
        return Outcome(exc.status, error_envelope(exc.message, exc.type, exc.param, exc.code))
    except ApplianceError as exc:
        return _failure(exc)
    content = response.content if isinstance(response.content, bytes) else json.dumps(response.content).encode()
    return Outcome(200, json.loads(content), response.headers.get("x-request-id"))
