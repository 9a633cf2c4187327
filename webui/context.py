"""Per-request console state (the signed-in user, the CSRF token) and the console's shared state.

Console handlers receive their collaborators by parameter name through
Litestar's dependency injection: the daemon's (``store``, ``router``, ``audit``,
...; ``appliance.api.dependencies``) and the console's own, registered on the
console router (:func:`dependencies`): ``console``, the :class:`Console` built
once per app, ``user``, the signed-in :class:`ConsoleUser`, ``sso``, single
sign-on (404 when not configured), and ``load_planner``,
which plans a load of an installed variant exactly as the daemon's router does
(the fit badges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import Provide
from sqlalchemy.engine import Engine

from appliance.errors import NotFound, PermissionDenied
from appliance.serving.load_plan import LoadPlanner
from appliance.settings import Settings
from appliance.sso.signon import SingleSignOn
from appliance.webui.chat import ChatStore
from appliance.webui.sessions import SessionStore, load_secret
from appliance.webui.throttle import LoginThrottle

if TYPE_CHECKING:
    from appliance.services import Services

SCOPE_USER = "appliance.console_user"
SCOPE_CSRF = "appliance.console_csrf"
ROLE_RANK = {"viewer": 0, "operator": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class ConsoleUser:
    id: int
    username: str
    role: str
    must_change_password: bool
    sid: str
    from_sso: bool = False

    @property
    def actor(self) -> str:
        """How the audit log names this user."""
        return f"user:{self.username}"

    def can(self, role: str) -> bool:
        return ROLE_RANK.get(self.role, -1) >= ROLE_RANK[role]


class Console:
    """Console state shared by all requests: the CSRF secret, sessions, sign-in throttle, playground chats,
    and single sign-on (None when no identity provider is configured)."""

    def __init__(self, settings: Settings, db: Engine):
        self.secret = load_secret(settings.session_secret, settings.data_dir)
        self.sessions = SessionStore(db)
        self.throttle = LoginThrottle()
        self.chats = ChatStore()
        self.local_login = settings.local_login_enabled
        self.sso = SingleSignOn.from_settings(settings)


def daemon_services(state: State) -> Services:
    """The daemon's collaborators, for what runs before any handler and so cannot take DI parameters:
    the console's guard (``appliance.webui.gate``) and the one-time build of the :class:`Console`.
    Handlers name the collaborators they need as parameters instead."""
    return state.services


def provide_console(state: State) -> Console:
    """The console's state: built on first use from the daemon's settings and database, then kept on the app."""
    found: Console | None = state.get("console")
    if found is None:
        services = daemon_services(state)
        found = state.console = Console(services.settings, services.db)
    return found


def console(connection: ASGIConnection) -> Console:
    """The console's state, for code that is not a console handler (the guard, the admin API's user routes)."""
    return provide_console(connection.app.state)


def console_user(connection: ASGIConnection) -> ConsoleUser | None:
    found = connection.scope.get(SCOPE_USER)
    return found if isinstance(found, ConsoleUser) else None


def require_user(request: Request) -> ConsoleUser:
    """The signed-in user; a console handler names it as its ``user`` parameter."""
    user = console_user(request)
    if user is None:  # the gate guarantees one on every non-public route
        raise PermissionDenied("Sign in first.")
    return user


def require_sso(state: State) -> SingleSignOn:
    """Single sign-on; a handler names it as its ``sso`` parameter and answers 404 when none is configured."""
    found = provide_console(state).sso
    if found is None:
        raise NotFound("Single sign-on is not configured.")
    return found


def dependencies() -> dict[str, Provide]:
    """The console's own injectables, registered on the console router."""
    return {
        "console": Provide(provide_console, sync_to_thread=False),
        "user": Provide(require_user, sync_to_thread=False),
        "load_planner": Provide(LoadPlanner, sync_to_thread=False),
        "sso": Provide(require_sso, sync_to_thread=False),
    }


def csrf_for(request: Request) -> str:
    return request.scope.get(SCOPE_CSRF, "")  # type: ignore[return-value]


def is_https(request: Request) -> bool:
    return request.url.scheme == "https"
