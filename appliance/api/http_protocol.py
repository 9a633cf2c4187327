"""uvicorn's HTTP protocol with a deadline for request headers (slowloris defence).

uvicorn closes idle keep-alive connections, but a connection that opens and
then sends its request line and headers a byte at a time is held for as long as
the client likes. Here a timer starts when a connection opens or a new request
begins, and closes the connection unless the headers are complete in time.
Bodies have their own per-chunk deadline at the ASGI edge (``appliance.api.edge``).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """An ``HttpToolsProtocol`` subclass that closes connections whose headers take over ``seconds``."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
