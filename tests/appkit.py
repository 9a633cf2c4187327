"""In-process apps for controller tests, called as the local admin.

The daemon marks requests from its admin Unix socket as the local admin
(``appliance.api.edge``) and the access guard (``appliance.api.access``) turns that
mark into the caller. These apps do the same, so a controller test exercises
the real guard and the audit actor it derives, not a shortcut around them.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar

from appliance.api.access import LOCAL_MARK, AccessGuard
from appliance.api.dependencies import dependencies


def _from_admin_socket(app: Any) -> Any:
    async def marked(scope: Any, receive: Any, send: Any) -> None:
        scope[LOCAL_MARK] = True
        await app(scope, receive, send)

    return marked


def local_admin_app(route_handlers: list[Any], services: Any, **kwargs: Any) -> Litestar:
    """A Litestar app whose every request arrives as if on the admin socket.

    ``services`` stands in for the composition root: the app's dependency
    providers read the collaborators a handler names from it.
    """
    app = Litestar(
        route_handlers=route_handlers,
        guards=[AccessGuard(lambda: None)],
        dependencies=dependencies(),
        middleware=[_from_admin_socket],
        **kwargs,
    )
    app.state.services = services
    return app
