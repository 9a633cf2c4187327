"""Per-request console state: the signed-in user, the CSRF token, the console's services."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request

from appliance.errors import PermissionDenied

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

    @property
    def actor(self) -> str:
        """How the audit log names this user."""
        return f"user:{self.username}"

    def can(self, role: str) -> bool:
        return ROLE_RANK.get(self.role, -1) >= ROLE_RANK[role]


class Console:
    """Console state shared by all requests, built on first use from the app's services."""

    def __init__(self, services: Any):
        from appliance.webui.chat import ChatStore
        from appliance.webui.sessions import SessionStore, load_secret
        from appliance.webui.throttle import LoginThrottle

        settings = services.settings
        self.secret = load_secret(settings.session_secret, settings.data_dir)
        self.sessions = SessionStore(services.db)
        self.throttle = LoginThrottle()
        self.chats = ChatStore()


def services(request: Request) -> Any:
    return request.app.state.services


def console(request: Request) -> Console:
    state = request.app.state
    found = getattr(state, "console", None)
    if found is None:
        found = Console(state.services)
        state.console = found
    return found


def console_user(request: Request) -> ConsoleUser | None:
    return request.scope.get(SCOPE_USER)  # type: ignore[return-value]


def require_user(request: Request) -> ConsoleUser:
    user = console_user(request)
    if user is None:  # the gate guarantees one on every non-public route
        raise PermissionDenied("Sign in first.")
    return user


def csrf_for(request: Request) -> str:
    return request.scope.get(SCOPE_CSRF, "")  # type: ignore[return-value]


def is_https(request: Request) -> bool:
    return request.url.scheme == "https"


def audit(request: Request, action: str, target: str | None = None, detail: str | None = None) -> None:
    services(request).audit(require_user(request).actor, action, target, detail)
