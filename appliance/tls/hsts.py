"""Strict-Transport-Security on every response the daemon sends over https (an ASGI wrapper)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class StrictTransport:
    """Adds ``Strict-Transport-Security: max-age=N`` to https responses that do not set one. No
    ``includeSubDomains``: the appliance does not speak for the rest of its domain."""

    def __init__(self, app: ASGIApp, max_age: int):
        self.app = app
        self.header = (b"strict-transport-security", f"max-age={max_age}".encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == self.header[0] for name, _ in headers):
                    headers.append(self.header)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_header)
