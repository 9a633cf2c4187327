"""``/docs``: the manual, served by the box itself (an air-gapped network reaches no docs website).

Who may read it: the manual holds no secret, but the appliance's rule is that every route except the
health probes needs a credential, and the manual keeps it. A browser reads it with a console session
(any role, viewers included: the console's guard, so a signed-out visitor is sent to ``/login`` and
back); a script or ``curl`` with any valid API key (``Authorization: Bearer`` or ``x-api-key``),
which is refused with 401 when wrong. Nothing is written and nothing but GET is answered.

Which file: the path after ``/docs/`` is resolved by :class:`appliance.manual.site.ManualSite`, which
never answers a file outside the built site. Every response carries the console's security headers;
pages carry their own Content-Security-Policy (``'self'`` plus the hashes of the page's inline
scripts, never ``unsafe-inline`` or ``unsafe-eval``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote

from litestar import Request, Response, Router, get
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.response import File, Redirect

from appliance.accounts.keys import token_from_headers
from appliance.api.access import PRINCIPAL, Access, requires
from appliance.errors import AuthenticationFailed, NotFound
from appliance.manual.site import ManualSite, installed_site_root
from appliance.webui.context import daemon_services
from appliance.webui.gate import EXCEPTION_HANDLERS, gate

PREFIX = "/docs"
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}

#: The site's file types (Litestar adds the charset to text/*): scripts and styles must carry their real type, as
#: nosniff makes browsers refuse others.
MEDIA_TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".xml": "application/xml",
    ".gz": "application/gzip",
    ".map": "application/json",
    ".txt": "text/plain",
}


def media_type(path: Path) -> str:
    return MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")


async def manual_reader(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """A guard: any valid API key, else the console's own (a signed-in user of any role)."""
    headers = connection.headers
    if headers.get("authorization") is None and headers.get("x-api-key") is None:
        await gate(connection, handler)
        return
    keyring = daemon_services(connection.app.state).keyring
    if keyring is None:
        raise AuthenticationFailed("The appliance is starting.")
    token = token_from_headers(headers.get("authorization"), headers.get("x-api-key"))
    principal = keyring.remembered(token)
    if principal is None:
        principal = await asyncio.to_thread(keyring.authenticate, token)
    connection.scope[PRINCIPAL] = principal  # type: ignore[literal-required]


def manual_router(site: ManualSite | None = None) -> Router:
    """The ``/docs`` routes over ``site`` (the installed manual unless given)."""
    manual = site or ManualSite(installed_site_root())

    @get(["/", "/{path:path}"], name="manual", include_in_schema=False)
    async def manual_file(request: Request) -> Response | File:
        # Litestar routes /docs, /docs/ and /docs/x/ alike; the path as sent tells them apart (the edge has
        # already refused any spelling that is not canonical: dot segments, encoded slashes or dots, NUL).
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        wanted = unquote(raw.decode("latin-1")).removeprefix(PREFIX)
        if not wanted:
            # Pages link to each other relatively (use_directory_urls: false): the root must end with a slash.
            return Redirect(path=PREFIX + "/", status_code=308, headers=_HEADERS)
        if not manual.built:
            raise NotFound("The manual was not built into this installation (tools/build_manual.sh builds it).")
        found = manual.find(wanted)
        if found is None:
            raise NotFound("No such page in the manual.")
        headers = {
            **_HEADERS,
            "Content-Security-Policy": manual.policy(found),
            "Cache-Control": "no-cache" if found.suffix == ".html" else "max-age=3600",
        }
        return File(path=found, media_type=media_type(found), content_disposition_type="inline", headers=headers)

    return Router(
        path=PREFIX,
        route_handlers=[manual_file],
        guards=[manual_reader],
        opt=requires(Access.CONSOLE),  # the app-wide guard defers; manual_reader decides
        exception_handlers=EXCEPTION_HANDLERS,
        include_in_schema=False,
        tags=["manual"],
    )
