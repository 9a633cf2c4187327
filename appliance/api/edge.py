"""The outermost ASGI layer: the HTTP edge, before any routing.

It wraps the whole Litestar app, so it sees every request, including ones that
match no route, and refuses what no route should ever see:

- a Host header that is missing, repeated, malformed or not allowed (DNS
  rebinding), on the public listener;
- a path that is not in canonical form (``//``, ``/./``, ``/../``, encoded
  slashes, dots, backslashes, semicolons or NUL bytes), so that no spelling of
  a path can be routed one way and read another;
- a query parameter given more than once (``?id=1&id=2``): no route takes a
  list, and the router would quietly keep one of the values;
- an absolute-form request target (``GET http://evil.example/v1/models``)
  whose authority is not the Host header's allowed value.

Deadlines for headers and bodies and the caps on header size are the HTTP
protocol's (:mod:`appliance.api.http_protocol`): they act before a request
reaches any ASGI code.

It also starts each request's clock and names it (:mod:`appliance.serving.timing`):
every response carries ``x-request-id`` and ``x-appliance-overhead-ms``, the
daemon's own time up to the response's first byte, and the overhead of each
request the gateway served is observed at its last byte. Each request that ends
is handed to the request log (:mod:`appliance.api.request_trace`), refusals made
here included.

Authentication is not done here: each route declares who may call it and one
guard checks that after routing (``appliance.api.access``). Requests that arrive on
the admin Unix socket are marked as the local admin: only the appliance's user
and group can open that socket (mode 0660).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from urllib.parse import parse_qsl

from litestar.types import ASGIApp, HTTPResponseBodyEvent, HTTPResponseStartEvent, Message, Receive, Scope, Send

from appliance.api.access import LOCAL_MARK
from appliance.api.http_protocol import TARGET_AUTHORITY
from appliance.api.request_trace import RequestRecorder, RequestTrace, note_reason
from appliance.errors import ApplianceError, BadRequest, HostNotAllowed
from appliance.serving.timing import HEADER, SCOPE_KEY, RequestTiming

#: Called with (endpoint, seconds) for each request the gateway served, at its last byte.
OverheadObserver = Callable[[str, float], None]


# A reg-name or IPv4 address, or a bracketed IPv6 address, then an optional numeric port.
_HOST = re.compile(r"^(?P<name>[a-z0-9](?:[a-z0-9.\-]*[a-z0-9])?|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?$", re.IGNORECASE)
# Encoded '/', '\', '.', ';', '%' and NUL, raw backslashes, semicolons and NULs, empty or dot segments.
_NON_CANONICAL = re.compile(rb"%(?:2f|5c|2e|3b|25|00)|[\\;\x00]|//|/\.\.?(?:/|$)", re.IGNORECASE)


def error_body(exc: ApplianceError) -> bytes:
    return json.dumps(exc.envelope()).encode()


async def send_error(send: Send, exc: ApplianceError) -> None:
    body = error_body(exc)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": exc.status, "headers": headers}
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)


def host_allowed(values: list[bytes], allowed: frozenset[str]) -> bool:
    """One Host header, well formed, whose name (and port, where the entry names one) is allowed."""
    if "*" in allowed:
        return True
    if len(values) != 1:
        return False
    try:
        host = values[0].decode("ascii").lower()
    except UnicodeDecodeError:
        return False
    match = _HOST.match(host)
    if match is None:
        return False
    port = match["port"]
    if port is not None and not 1 <= int(port) <= 65535:
        return False
    return match["name"] in allowed or host in allowed


def target_matches_host(authority: bytes | None, hosts: list[bytes]) -> bool:
    """An absolute-form target's authority names the same host and port as the (one) Host header.

    The Host check then covers both: a request cannot say one host on its request line and another in Host."""
    if authority is None:
        return True
    return len(hosts) == 1 and bool(authority) and authority.lower() == hosts[0].lower()


def canonical(raw_path: bytes) -> bool:
    """True when the path as sent needs no normalising: routing and every check read it the same way."""
    return raw_path.startswith(b"/") and _NON_CANONICAL.search(raw_path) is None


class ApplianceASGI:
    """Host check and canonical paths in front of the Litestar app; each request's id, clock and log entry."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: list[str],
        *,
        local: bool = False,
        observe_overhead: OverheadObserver | None = None,
        record_request: RequestRecorder | None = None,
    ):
        self.app = app
        self._observe = observe_overhead
        self._record = record_request
        self._allowed = frozenset(h.lower() for h in allowed_hosts)
        self._local = local

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        trace = None
        if scope["type"] == "http":
            timing = RequestTiming()
            scope[SCOPE_KEY] = timing  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys
            send = self._timed_send(send, timing)
            if self._record is not None:
                trace = RequestTrace(scope, timing, self._record)
                send = trace.wrap(send)
        if self._local:
            scope[LOCAL_MARK] = True  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                note_reason(scope, refusal.code, refusal.type)
                await send_error(send, refusal)
                return
            await self.app(scope, receive, send)
        finally:
            if trace is not None:
                trace.finish()

    def _refusal(self, scope: Scope) -> ApplianceError | None:
        """What no route should see: a Host not allowed, a target naming another host, a path not in canonical
        form, a query parameter given twice. None when the request may be routed."""
        if not self._local:
            hosts = [value for key, value in scope.get("headers") or () if key == b"host"]
            if not host_allowed(hosts, self._allowed):
                shown = b", ".join(hosts).decode("latin-1")[:200]
                return HostNotAllowed(f"Host {shown!r} is not allowed. Add it to APPLIANCE_ALLOWED_HOSTS.")
            target = scope.get(TARGET_AUTHORITY)  # set by the listener's protocol for an absolute-form target
            if not target_matches_host(target if isinstance(target, bytes) else None, hosts):
                return BadRequest(
                    "The request target names a host other than the Host header; send the path alone.",
                    code="target_host_mismatch",
                )
        raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        if not canonical(raw_path):
            return BadRequest(
                "The request path is not in canonical form (no '//', '.' or '..' "
                "segments, encoded '/', '.', ';', '%' or NUL bytes).",
                code="non_canonical_path",
            )
        repeated = repeated_query_name(scope.get("query_string") or b"")
        if repeated is not None:
            return BadRequest(
                f"The query parameter {repeated!r} is given more than once; every parameter here takes one value.",
                param=repeated,
                code="repeated_query_parameter",
            )
        return None

    def _timed_send(self, send: Send, timing: RequestTiming) -> Send:
        observe = self._observe

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = b"%.3f" % (timing.overhead_s() * 1000)
                message["headers"] = [*message.get("headers", ()), (HEADER, value)]
            elif (
                message["type"] == "http.response.body"
                and not message.get("more_body")
                and timing.endpoint
                and observe is not None
            ):
                observe(timing.endpoint, timing.overhead_s())
            await send(message)

        return timed


def repeated_query_name(query_string: bytes) -> str | None:
    """The first query parameter named twice (``?id=1&id=2``, ``?id=1&i%64=2``), or None.

    No route takes a list in its query, and the router would quietly keep one of the values."""
    if not query_string:
        return None
    seen: set[str] = set()
    for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name in seen:
            return name[:64]
        seen.add(name)
    return None
