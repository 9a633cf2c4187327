"""The optional plain-HTTP port (``tls_redirect_port``): every request is answered 301 to the same path on https.

Nothing else happens there: no route runs, no body is read, no credential is looked at, and the connection is
closed after the answer. The Host header must be one of ``allowed_hosts`` (the same DNS-rebinding rule as the
https port), so the redirect never points at a host the admin did not name.
"""

from __future__ import annotations

from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send

from appliance.api.edge import host_allowed, send_error
from appliance.errors import BadRequest, HostNotAllowed


def https_location(host: str, https_port: int, raw_path: bytes, query: bytes) -> str:
    """``https://host[:port]/path?query`` for a Host header value (its port, if any, replaced by ``https_port``)."""
    name = host[: host.index("]") + 1] if host.startswith("[") else host.split(":", 1)[0]
    path = raw_path.decode("latin-1") if raw_path.startswith(b"/") else "/"
    authority = name if https_port == 443 else f"{name}:{https_port}"
    return f"https://{authority}{path}" + (f"?{query.decode('latin-1')}" if query else "")


class RedirectToHttps:
    """ASGI app of the plain-HTTP port."""

    def __init__(self, allowed_hosts: list[str], https_port: int):
        self._allowed = frozenset(h.lower() for h in allowed_hosts)
        self._port = https_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        if not hosts or not host_allowed(hosts, self._allowed):
            await send_error(send, HostNotAllowed("Host is not allowed. Add it to APPLIANCE_ALLOWED_HOSTS."))
            return
        try:
            host = hosts[0].decode("ascii").lower()
        except UnicodeDecodeError:
            host = ""
        location = https_location(host, self._port, scope.get("raw_path") or b"/", scope["query_string"])
        if not host or any(c in location for c in "\r\n\x00"):
            await send_error(send, BadRequest("Malformed request target."))
            return
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": 301,
            "headers": [(b"location", location.encode("latin-1")), (b"content-length", b"0"), (b"connection", b"close")],
        }
        await send(start)
        body: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(body)
