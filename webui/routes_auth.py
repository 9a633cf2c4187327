"""Sign-in, sign-out and password changes (including the forced first-run change)."""

from __future__ import annotations

import re

from litestar import Request, Response, get, post
from litestar.datastructures import Cookie, UploadFile
from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlmodel import col

from appliance.accounts.users import hash_password, password_problem, verify_password
from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import User
from appliance.webui import csrf
from appliance.webui.context import Console, ConsoleUser, console_user, is_https
from appliance.webui.gate import SCOPE_PRE_NEW
from appliance.webui.render import page, partial
from appliance.webui.sessions import clear_cookie, session_cookie

_DUMMY_HASH: list[str] = []


def _dummy_hash() -> str:
    """A real argon2 hash to verify against when the user is unknown, so both cases cost the same."""
    if not _DUMMY_HASH:
        _DUMMY_HASH.append(hash_password("not-a-real-password-xyzzy"))
    return _DUMMY_HASH[0]


# A same-origin absolute path: '/', then printable ASCII other than '\\' (no space, tab, control or non-ASCII
# character: browsers drop or rewrite those and may then read '/\t/evil' as '//evil'), and never '//' at the start.
_LOCAL_PATH = re.compile(r"/(?![/\\])[!-\[\]-~]*")


def safe_next(value: str | UploadFile | None) -> str:
    """Where to go after signing in: a path on this site, else '/'.

    '/x' yes; '//evil', a backslash anywhere, 'https://evil', whitespace, control and non-ASCII characters no."""
    if isinstance(value, str) and len(value) < 512 and _LOCAL_PATH.fullmatch(value):
        return value
    return "/"


def _login_page(
    request: Request,
    console: Console,
    *,
    status: int = 200,
    error: str | None = None,
    username: str = "",
    next_url: str = "/",
    headers: dict[str, str] | None = None,
) -> Response:
    sso_name = console.sso.config.provider_name if console.sso else None
    response = page(
        request,
        "login.html",
        status=status,
        headers=headers,
        error=error,
        username=username,
        next_url=next_url,
        sso_name=sso_name,
        local_login=console.local_login,
    )
    fresh = request.scope.get(SCOPE_PRE_NEW)
    if isinstance(fresh, str) and fresh:
        response.set_cookie(
            Cookie(
                key=csrf.PRE_COOKIE,
                value=fresh,
                path="/",
                httponly=True,
                samesite="strict",
                secure=is_https(request),
                max_age=3600,
            )
        )
    return response


@get("/login", opt={"public": True}, include_in_schema=False, sync_to_thread=False)
def login_form(request: Request, console: Console) -> Response:
    if console_user(request) is not None:
        return Response(content="", status_code=303, headers={"Location": "/"})
    return _login_page(request, console, next_url=safe_next(request.query_params.get("next")))


@post("/login", opt={"public": True}, include_in_schema=False)
async def login(request: Request, console: Console, db: Engine, audit: AuditTrail) -> Response:
    form = await request.form()
    username = str(form.get("username") or "").strip()[:64]
    password = str(form.get("password") or "")[:1024]
    next_url = safe_next(form.get("next"))
    client = request.client.host if request.client else None
    if not console.local_login:
        audit.record(f"user:{username or '?'}", "console.login_failed", None, f"client={client} local sign-in is off")
        return _login_page(
            request,
            console,
            status=403,
            next_url=next_url,
            error="Sign-in with a local password is switched off here; use single sign-on.",
        )
    wait = console.throttle.retry_after(username, client)
    if wait is not None:  # refused before the password is checked, so a throttled guess learns nothing
        return _login_page(
            request,
            console,
            status=429,
            username=username,
            next_url=next_url,
            headers={"Retry-After": str(wait.seconds)},
            error=wait.message,
        )
    with session(db) as s:
        row = s.execute(select(User).where(col(User.username) == username)).scalars().first()
    ok = verify_password(row.password_hash if row else _dummy_hash(), password)
    if not ok or row is None or row.disabled or row.sso_subject is not None:  # single sign-on users have no password
        console.throttle.failed(username, client)
        audit.record(f"user:{username or '?'}", "console.login_failed", None, f"client={client}")
        return _login_page(
            request, console, status=401, username=username, next_url=next_url, error="Wrong user name or password."
        )
    console.throttle.succeeded(username)
    old = request.cookies.get("appliance_session")
    console.sessions.delete(old)  # never reuse a session id across sign-ins
    console.sessions.prune()
    assert row.id is not None  # read from the database
    sid = console.sessions.create(row.id)
    audit.record(f"user:{row.username}", "console.login", None, f"client={client}")
    target = "/password" if row.must_change_password else next_url
    response = Response(content="", status_code=303, headers={"Location": target})
    response.set_cookie(session_cookie(sid, is_https(request)))
    response.set_cookie(
        Cookie(key=csrf.PRE_COOKIE, value="", path="/", max_age=0, httponly=True, samesite="strict", secure=is_https(request))
    )
    return response


@post("/logout", opt={"during_setup": True}, include_in_schema=False)
async def logout(request: Request, user: ConsoleUser, console: Console, audit: AuditTrail) -> Response:
    console.sessions.delete(user.sid)
    audit.record(user.actor, "console.logout")
    target = "/login"
    provider_logout = None
    if user.from_sso and console.sso is not None:  # end the provider's session too, when it offers that
        provider_logout = await console.sso.logout_url(user.sid, console.sso.login_page_url(str(request.base_url)))
    if request.headers.get("hx-request") == "true":
        response = Response(content="", status_code=200, headers={"HX-Redirect": provider_logout or target})
    elif provider_logout:
        # A page that moves on, not a redirect: the CSP's form-action 'self' would stop a form's redirect off-site.
        response = page(request, "sso_continue.html", heading="Signed out", target=provider_logout)
    else:
        response = Response(content="", status_code=303, headers={"Location": target})
    clear_cookie(response, is_https(request))
    return response


@get("/password", opt={"during_setup": True}, include_in_schema=False, sync_to_thread=False)
def password_form(request: Request) -> Response:
    return page(request, "password.html", active=None, error=None, done=False)


@post("/password", opt={"during_setup": True}, include_in_schema=False)
async def change_password(request: Request, user: ConsoleUser, console: Console, db: Engine, audit: AuditTrail) -> Response:
    form = await request.form()
    current = str(form.get("current") or "")
    new = str(form.get("new") or "")
    confirm = str(form.get("confirm") or "")
    with session(db) as s:
        row = s.get(User, user.id)
    error = None
    if row is None or not verify_password(row.password_hash, current):
        error = "The current password is wrong."
    elif (weak := password_problem(new, user.username)) is not None:
        error = weak
    elif new != confirm:
        error = "The two new passwords differ."
    elif new == current:
        error = "Choose a password different from the current one."
    htmx = request.headers.get("HX-Request") == "true"
    if error:  # htmx: only the message; the browser keeps the fields as typed, and no password is ever sent back
        if htmx:
            return partial(request, "_alert.html", status=400, kind="error", message=error)
        return page(request, "password.html", status=400, error=error, done=False)
    with session(db) as s:
        changed = update(User).where(col(User.id) == user.id)
        s.execute(changed.values(password_hash=hash_password(new), must_change_password=False))
        s.commit()
    ended = console.sessions.delete_for_user(user.id, keep=user.sid)
    audit.record(user.actor, "user.password_change", user.username, f"other_sessions_ended={ended}")
    if user.must_change_password:
        if htmx:
            return Response(content="", status_code=200, headers={"HX-Redirect": "/"})
        return Response(content="", status_code=303, headers={"Location": "/"})
    if htmx:
        return partial(request, "_password_done.html")
    return page(request, "password.html", error=None, done=True)


HANDLERS = [login_form, login, logout, password_form, change_password]
