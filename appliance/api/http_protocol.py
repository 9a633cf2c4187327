"""uvicorn's HTTP protocol with the limits an anonymous client must not escape.

uvicorn closes idle keep-alive connections, and nothing else: a client that
sends its headers or its body a byte at a time, or sends megabytes of headers,
is served for as long as it likes. This protocol adds, per connection:

- a header deadline: the request line and headers must be complete within
  ``header_timeout`` of the request's first byte (or of the connection opening);
  else the connection is closed;
- a body deadline for the whole body, not for each chunk: it must be complete
  within ``body_timeout`` of the headers; else the client gets a 408 and the
  connection is closed (the handler's ``receive`` sees a disconnect);
- a cap on the request line and headers together (``max_header_bytes``) and on
  the number of header lines (``max_header_count``): past either, a 431 and the
  connection is closed, before the request reaches the app;
- absolute-form request targets (``GET http://host/path``) hand their authority
  to the app in the scope, so the Host check sees it (:mod:`appliance.api.edge`);
- on the public listener, the per-address cap on anonymous connections of
  :mod:`appliance.api.peer_guard`.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Callable
from dataclasses import dataclass

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from appliance.api.peer_guard import CONNECTION_KEY, PeerGuard, Ticket

#: Scope key holding the authority (``host[:port]``, bytes) of an absolute-form request target.
TARGET_AUTHORITY = "appliance.target_authority"

_LINGER_SECONDS = 2.0  # after a 431, the rest of what the client sends is read and dropped this long, then closed


@dataclass(frozen=True)
class EdgeLimits:
    header_timeout: float
    body_timeout: float
    max_header_bytes: int
    max_header_count: int


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request whose headers are past the caps."""


def raw_response(status: int, code: str, message: str) -> bytes:
    """A whole ``Connection: close`` response with an OpenAI-shaped error body, written straight to the socket."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _authority(target: bytes) -> bytes:
    """``host[:port]`` of an absolute-form target; empty for other forms or what does not parse."""
    try:
        url = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        return b""
    if not url.host:
        return b""
    return url.host + (b":%d" % url.port if url.port is not None else b"")


def edge_protocol(limits: EdgeLimits, guard: PeerGuard | None = None) -> type[asyncio.Protocol]:
    """An ``HttpToolsProtocol`` subclass enforcing ``limits`` (and ``guard``, on the public listener)."""

    class EdgeProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _in_headers = False
        _tally = 0  # request line and complete headers of the current request, in bytes
        _raw = 0  # bytes fed while the headers were unfinished, from the second read on
        _count = 0
        _refused = False
        _ticket: Ticket | None = None
        _peer = ""

        # -- connection ---------------------------------------------------------------
        def connection_made(  # type: ignore[override]  # uvicorn's signature: a Transport where asyncio has BaseTransport
            self, transport: asyncio.Transport
        ) -> None:
            super().connection_made(transport)
            self._arm(limits.header_timeout, self._headers_expired)
            if guard is not None and self.client:
                self._peer = str(self.client[0])
                self._ticket = Ticket(self, guard, self._peer)
                guard.opened(self._peer, self._ticket)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if guard is not None and self._ticket is not None:
                guard.closed(self._peer, self._ticket)
            super().connection_lost(exc)

        def evict(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # lingering after a 431: read and drop
            self._unset_keepalive_if_required()
            began_earlier = self._in_headers
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                if not self._refused:  # a 431 was written already when the caps stopped the parser
                    self.send_400_response("Invalid HTTP request received.")
                return
            except httptools.HttpParserUpgrade:
                self._disarm()  # the WebSocket protocol takes the connection over
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if self._in_headers:
                if began_earlier:
                    self._raw += len(data)  # every byte of this read belongs to the unfinished headers
                if self._raw > limits.max_header_bytes:
                    self._refuse_headers()

        # -- parser callbacks -----------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._tally = self._raw = self._count = 0
            self._arm(limits.header_timeout, self._headers_expired)

        def on_url(self, url: bytes) -> None:
            self._tally += len(url)
            if self._tally > limits.max_header_bytes:
                self._refuse_headers()
                raise _HeadersTooLarge
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._tally += len(name) + len(value) + 4
            self._count += 1
            if self._tally > limits.max_header_bytes or self._count > limits.max_header_count:
                self._refuse_headers()
                raise _HeadersTooLarge
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm()
            if self.url[:1] != b"/":  # absolute-form (or authority- or asterisk-form): the edge checks it
                self.scope[TARGET_AUTHORITY] = _authority(self.url)  # type: ignore[literal-required]  # ASGI keys only typed
            if self._ticket is not None:
                self.scope[CONNECTION_KEY] = self._ticket  # type: ignore[literal-required]  # ASGI keys only typed
            super().on_headers_complete()
            self._arm(limits.body_timeout, self._body_expired)

        def on_message_complete(self) -> None:
            self._disarm()
            if self._ticket is not None and self.cycle is not None and not self.cycle.response_complete:
                self._ticket.busy = True  # being answered: not closed for its address's count until the response ends
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._ticket is not None:
                self._ticket.busy = False
            super().on_response_complete()

        # -- deadlines and refusals --------------------------------------------------------
        def _arm(self, seconds: float, callback: Callable[[], object]) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_expired(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _body_expired(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.disconnected = True  # the handler's receive sees a disconnect; its sends are dropped
                cycle.message_event.set()
                message = f"The request body did not arrive in full within {limits.body_timeout:g} s."
                self.transport.write(raw_response(408, "request_timeout", message))
            self.transport.close()

        def _refuse_headers(self) -> None:
            if self._refused:
                return
            self._refused = True
            self._disarm()
            message = (
                f"The request line and headers are past {limits.max_header_bytes} bytes "
                f"or {limits.max_header_count} header lines."
            )
            self.transport.write(raw_response(431, "headers_too_large", message))
            self.loop.call_later(_LINGER_SECONDS, self.evict)

    return EdgeProtocol
