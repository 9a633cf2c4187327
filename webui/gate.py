"""The console's front door: sessions, sign-in redirects, CSRF, roles, security headers, errors.

``gate`` is the console router's guard, so it runs before every console handler:
it loads the session, sends signed-out visitors to ``/login`` (303, or
``HX-Redirect`` for htmx), forces the first-run password change, and checks the
CSRF token of every unsafe request. Handlers marked ``opt={"public": True}``
(the sign-in form) skip the sign-in requirement but not CSRF.
"""

from __future__ import annotations

import logging
import secrets
from urllib.parse import quote

from litestar import MediaType, Request, Response
from litestar.connection import ASGIConnection
from litestar.datastructures import ResponseHeader
from litestar.exceptions import HTTPException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ExceptionHandlersMap, Guard
from sqlalchemy import Engine

from appliance.api.peer_guard import mark_authenticated
from appliance.api.request_trace import HTTP_REASONS, note_reason
from appliance.db.engine import session
from appliance.db.tables import User
from appliance.errors import ApplianceError, PermissionDenied
from appliance.webui import csrf
from appliance.webui.context import SCOPE_CSRF, SCOPE_USER, ConsoleUser, console, console_user, daemon_services
from appliance.webui.sessions import COOKIE

log = logging.getLogger("appliance.webui")

SCOPE_PRE_NEW = "appliance.console_pre_new"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

SECURITY_HEADERS = [
    ResponseHeader(name="Content-Security-Policy", value=CSP),
    ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
    ResponseHeader(name="X-Frame-Options", value="DENY"),
    ResponseHeader(name="Referrer-Policy", value="same-origin"),
    ResponseHeader(name="Cross-Origin-Opener-Policy", value="same-origin"),
    ResponseHeader(name="Permissions-Policy", value="camera=(), microphone=(), geolocation=()"),
    ResponseHeader(name="Cache-Control", value="no-store"),
]


class LoginRequired(Exception):
    """No valid session on a route that needs one."""


class PasswordChangeRequired(Exception):
    """The user signed in with a one-time password and must choose a new one."""


def load_user(db: Engine, user_id: int, sid: str) -> ConsoleUser | None:
    with session(db) as s:
        row = s.get(User, user_id)
    if row is None or row.disabled:
        return None
    assert row.id is not None  # read from the database
    return ConsoleUser(
        id=row.id,
        username=row.username,
        role=row.role,
        must_change_password=row.must_change_password,
        sid=sid,
        from_sso=row.sso_subject is not None,
    )


async def gate(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    request = connection
    assert isinstance(request, Request)  # the console's routes are all HTTP: Litestar hands their guard the Request
    con = console(request)
    opt = handler.opt or {}
    sid = request.cookies.get(COOKIE)
    record = con.sessions.get(sid) if sid else None
    user = load_user(daemon_services(request.app.state).db, record.user_id, sid) if record and sid else None
    if user is not None:
        request.scope[SCOPE_USER] = user  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys
        mark_authenticated(request.scope)
        purpose, binding = "session", user.sid
    else:
        pre = request.cookies.get(csrf.PRE_COOKIE)
        if not pre:
            pre = secrets.token_urlsafe(24)
            request.scope[SCOPE_PRE_NEW] = pre  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys
        purpose, binding = "pre", pre
    token = csrf.token(con.secret, purpose, binding)
    request.scope[SCOPE_CSRF] = token  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys
    if user is None and not opt.get("public"):
        raise LoginRequired()
    if user is not None and user.must_change_password and not opt.get("during_setup"):
        raise PasswordChangeRequired()
    await csrf.check(request, con.secret, purpose, None if SCOPE_PRE_NEW in request.scope else binding)


def needs(role: str) -> Guard:
    """A guard: the signed-in user has at least ``role`` (viewer < operator < admin)."""

    def guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
        user = console_user(connection)
        if user is None or not user.can(role):
            raise PermissionDenied(f"This action needs the {role} role.")

    guard.__name__ = f"needs_{role}"
    return guard


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _redirect(request: Request, to: str) -> Response:
    if is_htmx(request):
        return Response(content="", status_code=200, headers={"HX-Redirect": to})
    return Response(content="", status_code=303, headers={"Location": to})


def on_login_required(request: Request, _exc: Exception) -> Response:
    target = request.url.path
    if request.method == "GET" and target not in ("/", "/login") and not is_htmx(request):
        return _redirect(request, "/login?next=" + quote(target, safe="/"))
    return _redirect(request, "/login")


def on_password_change(request: Request, _exc: Exception) -> Response:
    return _redirect(request, "/password")


def _error(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    from appliance.webui.render import page, render

    headers = {**(headers or {}), **{h.name: h.value for h in SECURITY_HEADERS if h.value is not None}}
    if is_htmx(request):
        html = render("_alert.html", kind="error", message=message)
        return Response(
            content=html,
            status_code=status,
            media_type=MediaType.HTML,
            headers={**headers, "HX-Retarget": "#errors", "HX-Reswap": "innerHTML"},
        )
    return page(request, "error.html", status=status, headers=headers, status_code=status, message=message)


def on_appliance_error(request: Request, exc: ApplianceError) -> Response:
    note_reason(request.scope, exc.code, exc.type)
    if exc.status >= 500:
        log.warning("console action failed: %s", exc.message, extra={"fields": {"path": request.url.path}})
    return _error(request, exc.status, exc.message, exc.headers)


def on_http_exception(request: Request, exc: HTTPException) -> Response:
    note_reason(request.scope, HTTP_REASONS.get(exc.status_code), "server_error" if exc.status_code >= 500 else None)
    message = exc.detail if exc.status_code < 500 else "Internal server error."
    return _error(request, exc.status_code, message, dict(exc.headers or {}))


def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("console error on %s", request.url.path)
    note_reason(request.scope, "internal_error")
    return _error(request, 500, "Something went wrong; the details are in the appliance log.")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    LoginRequired: on_login_required,
    PasswordChangeRequired: on_password_change,
    ApplianceError: on_appliance_error,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
