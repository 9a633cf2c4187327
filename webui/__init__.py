"""The web console: server-rendered Jinja2 + htmx, mounted by ``appliance.app``.

``console_handlers()`` returns two routers: the vendored static assets under
``/static`` and the console itself under ``/``. The console renders its own
templates (``appliance.webui.render``), so the app needs no template config;
it authenticates with its own session cookie (``appliance.webui.sessions``), and
its guard (``appliance.webui.gate``) applies sign-in, CSRF and roles to every
route. Console actions call the daemon's collaborators directly, handed to each
handler by dependency injection (``appliance.webui.context``), never the admin API.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Router

STATIC = Path(__file__).parent / "static"


def console_handlers() -> list[Router]:
    from litestar.datastructures import CacheControlHeader
    from litestar.handlers import HTTPRouteHandler
    from litestar.static_files import create_static_files_router
    from litestar_htmx import HTMXRequest

    from appliance.api.access import Access, requires
    from appliance.webui import (
        routes_alerts,
        routes_aliases,
        routes_auth,
        routes_batches,
        routes_cache_policies,
        routes_keys,
        routes_models,
        routes_overview,
        routes_playground,
        routes_prices,
        routes_quantize,
        routes_requests,
        routes_settings,
        routes_sso,
        routes_system,
        routes_usage,
    )
    from appliance.webui.context import dependencies
    from appliance.webui.gate import EXCEPTION_HANDLERS, SECURITY_HEADERS, gate

    static = create_static_files_router(
        path="/static",
        directories=[STATIC],
        name="console-static",
        include_in_schema=False,
        cache_control=CacheControlHeader(max_age=3600),
        opt=requires(Access.PUBLIC),
    )
    handlers: list[HTTPRouteHandler] = []
    for module in (
        routes_auth,
        routes_sso,
        routes_overview,
        routes_alerts,
        routes_models,
        routes_playground,
        routes_keys,
        routes_usage,
        routes_requests,
        routes_batches,
        routes_system,
        routes_settings,
        routes_prices,
        routes_aliases,
        routes_cache_policies,
        routes_quantize,
    ):
        handlers.extend(module.HANDLERS)
    console = Router(
        path="/",
        route_handlers=handlers,
        guards=[gate],
        dependencies=dependencies(),
        opt=requires(Access.CONSOLE),
        exception_handlers=EXCEPTION_HANDLERS,
        response_headers=SECURITY_HEADERS,
        request_class=HTMXRequest,
        include_in_schema=False,
        tags=["console"],
    )
    return [static, console]
