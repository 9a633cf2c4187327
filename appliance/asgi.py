"""The outermost ASGI layer: Host check, then authentication of API routes.

It wraps the whole Litestar app, so it sees every request, including ones
that match no route. API routes (`/v1/*`, `/admin/*`, `/metrics`) need an API
key; the console authenticates with its own session cookie, and health probes
are open. Requests that arrive on the admin Unix socket are the local admin:
only the appliance's user and group can open that socket (mode 0660).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from appliance.auth import LOCAL_ADMIN, KeyRing, token_from_headers
from appliance.errors import ApplianceError, AuthenticationFailed, HostNotAllowed, PermissionDenied

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

PRINCIPAL = "appliance.principal"
LOCAL_MARK = "appliance.local"
API_PREFIXES = ("/v1/", "/admin/", "/metrics", "/openapi")
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def error_body(exc: ApplianceError) -> bytes:
    return json.dumps({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}).encode()


async def send_error(send: Callable[..., Awaitable[Any]], exc: ApplianceError) -> None:
    body = error_body(exc)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _host_allowed(host: str, allowed: frozenset[str]) -> bool:
    if "*" in allowed:
        return True
    if not host:
        return False
    if host.startswith("["):  # [::1]:8080
        name = host.split("]", 1)[0] + "]"
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return bool(name) and name.lower() in allowed


class ApplianceASGI:
    """Host check and API authentication in front of the Litestar app."""

    def __init__(self, app: ASGIApp, keyring_getter: Callable[[], KeyRing | None], allowed_hosts: list[str], local: bool = False):
        self.app = app
        self._keyring = keyring_getter
        self._allowed = frozenset(h.lower() for h in allowed_hosts)
        self._local = local

    async def __call__(self, scope: Scope, receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[Any]]) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self._local:
            scope[LOCAL_MARK] = True
            scope[PRINCIPAL] = LOCAL_ADMIN
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1")
        if not _host_allowed(host, self._allowed):
            await send_error(send, HostNotAllowed(f"Host {host!r} is not allowed. Add it to APPLIANCE_ALLOWED_HOSTS."))
            return
        path: str = scope["path"]
        if path.startswith(API_PREFIXES) and path not in OPEN_PATHS:
            keyring = self._keyring()
            try:
                if keyring is None:
                    raise AuthenticationFailed("The appliance is starting.")
                auth = headers.get(b"authorization")
                xkey = headers.get(b"x-api-key")
                token = token_from_headers(auth.decode("latin-1") if auth else None, xkey.decode("latin-1") if xkey else None)
                principal = keyring.authenticate(token)
                if path.startswith("/admin/") and not principal.is_admin:
                    raise PermissionDenied("This route needs an admin key.")
                scope[PRINCIPAL] = principal
            except ApplianceError as exc:
                await send_error(send, exc)
                return
        await self.app(scope, receive, send)
