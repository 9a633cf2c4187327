"""Who may call a route: declared where the route is defined, enforced after routing.

Every route handler (or the controller or router that owns it) carries
``opt={"access": Access.X}``. One app-level guard, :class:`AccessGuard`, runs
after Litestar has matched the request to a handler, so the decision follows
the handler that will run, never the spelling of the path: ``//admin/keys``,
``/admin/keys/`` and ``/admin/keys`` all reach the same handler and the same
check. A handler that declares no level is refused (fail closed), and a unit
test checks that every route of the app declares one.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from appliance.accounts.keys import LOCAL_ADMIN, KeyRing, Principal, token_from_headers
from appliance.api.peer_guard import mark_authenticated
from appliance.errors import AuthenticationFailed, PermissionDenied

ACCESS = "access"
PRINCIPAL = "appliance.principal"
LOCAL_MARK = "appliance.local"
METRICS_ROLE = "metrics"  # a key role that may call METRICS routes only


class Access(enum.StrEnum):
    """The credential a route needs."""

    PUBLIC = "public"  # health probes and the console's static assets
    KEY = "key"  # any valid API key
    ADMIN = "admin"  # an admin-role API key, or the local admin socket
    METRICS = "metrics"  # an admin or metrics-role API key, unless the metrics_public setting is on
    CONSOLE = "console"  # the console's own gate (session cookie, CSRF, roles) decides


def requires(level: Access) -> dict[str, Access]:
    """The ``opt`` a handler, controller or router declares its access level with."""
    return {ACCESS: level}


def principal_of(connection: ASGIConnection) -> Principal:
    """The authenticated caller of a keyed route (set by :class:`AccessGuard`)."""
    principal = connection.scope.get(PRINCIPAL)
    if not isinstance(principal, Principal):
        raise AuthenticationFailed("This route needs an API key.")
    return principal


def audit_actor(connection: ASGIConnection) -> str:
    """The audit log's name for the caller: ``key:<prefix>``, ``user:<name>`` or ``local-admin``."""
    principal = principal_of(connection)
    return principal.name if principal.kind == "local" else f"{principal.kind}:{principal.name}"


class AccessGuard:
    """The app-level guard: authenticates keyed routes and checks the declared level."""

    def __init__(self, keyring: Callable[[], KeyRing | None], *, metrics_public: Callable[[], bool] = lambda: False):
        self._keyring = keyring
        self._metrics_public = metrics_public

    async def __call__(self, connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        """A coroutine, so Litestar runs it on the event loop: a key it knows costs a hash and a dict look-up;
        a key it has not seen is looked up in the database on a worker thread."""
        level = (handler.opt or {}).get(ACCESS)
        if not isinstance(level, Access):
            raise PermissionDenied("This route declares no access level, so nobody may call it.")
        if level is Access.PUBLIC:
            return
        if level is Access.CONSOLE:
            await self._refuse_metrics_key(connection)
            return
        scope = connection.scope
        if scope.get(LOCAL_MARK):
            scope[PRINCIPAL] = LOCAL_ADMIN  # type: ignore[literal-required]
            return
        if level is Access.METRICS and self._metrics_public():  # asked each time: the setting applies live
            return
        keyring = self._keyring()
        if keyring is None:
            raise AuthenticationFailed("The appliance is starting.")
        headers = connection.headers
        token = token_from_headers(headers.get("authorization"), headers.get("x-api-key"))
        principal = keyring.remembered(token)
        if principal is None:
            principal = await asyncio.to_thread(keyring.authenticate, token)
        mark_authenticated(scope)  # a valid key: the connection leaves the per-address cap on anonymous ones
        scope[PRINCIPAL] = principal  # type: ignore[literal-required]  # before the role checks: a refusal names the key
        if level is Access.METRICS:
            if not principal.is_admin and principal.role != METRICS_ROLE:
                raise PermissionDenied("This route needs an admin or metrics key.")
        elif principal.role == METRICS_ROLE:
            raise PermissionDenied("A metrics key may read /metrics and nothing else.")
        elif level is Access.ADMIN and not principal.is_admin:
            raise PermissionDenied("This route needs an admin key.")

    async def _refuse_metrics_key(self, connection: ASGIConnection) -> None:
        """The console signs in with its own session; a metrics key sent to it is refused outright (403), so a
        scraper's credential opens nothing but /metrics. Any other key, or none, is left to the console's gate."""
        headers = connection.headers
        token = token_from_headers(headers.get("authorization"), headers.get("x-api-key"))
        keyring = self._keyring()
        if not token or keyring is None:
            return
        try:
            principal = keyring.remembered(token)
            if principal is None:
                principal = await asyncio.to_thread(keyring.authenticate, token)
        except AuthenticationFailed:
            return
        if principal.role == METRICS_ROLE:
            raise PermissionDenied("A metrics key may read /metrics and nothing else.")
