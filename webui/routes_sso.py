"""Single sign-on routes: ``/login/oidc`` sends the browser to the identity provider,
``/login/oidc/callback`` signs it in when the provider's answer checks out.

Both are public on purpose (the visitor is not signed in yet) and both are GETs,
as OpenID Connect's redirects are. The browser binding travels in a cookie that
is HttpOnly, limited to ``/login/oidc`` and ten minutes, and SameSite=Lax, because
the callback is a top-level navigation coming from the provider's site. For the
same reason the callback answers with a page that moves on to the console rather
than a redirect: a redirect would still count as coming from the provider, and
the browser would hold back the SameSite=Strict session cookie on the next page.
"""

from __future__ import annotations

from litestar import Request, Response, get
from litestar.datastructures import Cookie
from sqlalchemy.engine import Engine

from appliance.db.audit import AuditTrail
from appliance.sso.pending import TTL_SECONDS
from appliance.sso.refusals import SignOnForbidden, SignOnRefused
from appliance.sso.signon import COOKIE, COOKIE_PATH, SingleSignOn
from appliance.sso.users import user_from_sign_on
from appliance.webui import csrf
from appliance.webui.context import Console, is_https
from appliance.webui.render import page
from appliance.webui.routes_auth import safe_next
from appliance.webui.sessions import session_cookie


def _clear_binding(response: Response, secure: bool) -> None:
    response.set_cookie(Cookie(key=COOKIE, value="", path=COOKIE_PATH, max_age=0, httponly=True, samesite="lax", secure=secure))


def _refused(request: Request, audit: AuditTrail, exc: SignOnRefused, actor: str = "user:?") -> Response:
    client = request.client.host if request.client else None
    audit.record(actor, "console.sso_refused", None, f"reason={exc.reason} client={client}")
    response = page(request, "sso_refused.html", status=exc.status, message=exc.message)
    _clear_binding(response, is_https(request))
    return response


@get("/login/oidc", opt={"public": True}, include_in_schema=False)
async def sso_start(request: Request, sso: SingleSignOn, audit: AuditTrail) -> Response:
    try:
        redirect = await sso.begin(sso.redirect_uri(str(request.base_url)), safe_next(request.query_params.get("next")))
    except SignOnRefused as exc:
        return _refused(request, audit, exc)
    response = Response(content="", status_code=303, headers={"Location": redirect.url})
    response.set_cookie(
        Cookie(
            key=COOKIE,
            value=redirect.browser,
            path=COOKIE_PATH,
            httponly=True,
            samesite="lax",
            secure=is_https(request),
            max_age=TTL_SECONDS,
        )
    )
    return response


@get("/login/oidc/callback", opt={"public": True}, include_in_schema=False)
async def sso_callback(request: Request, sso: SingleSignOn, console: Console, db: Engine, audit: AuditTrail) -> Response:
    params = {name: str(request.query_params.get(name) or "") for name in ("state", "code", "error")}
    params = {name: value for name, value in params.items() if value}
    try:
        identity = await sso.complete(params, request.cookies.get(COOKIE), sso.redirect_uri(str(request.base_url)))
    except SignOnRefused as exc:
        return _refused(request, audit, exc)
    try:
        user = user_from_sign_on(db, identity.subject, identity.username, identity.role)
    except SignOnForbidden as exc:
        return _refused(request, audit, exc, f"user:{identity.username}")
    console.sessions.delete(request.cookies.get("appliance_session"))  # never reuse a session id across sign-ins
    console.sessions.prune()
    assert user.id is not None  # read from the database
    sid = console.sessions.create(user.id)
    sso.remember_id_token(sid, identity.id_token)
    client = request.client.host if request.client else None
    audit.record(f"user:{user.username}", "console.sso_login", None, f"role={user.role} client={client}")
    response = page(request, "sso_continue.html", heading="Signed in", target=identity.next_url)
    secure = is_https(request)
    response.set_cookie(session_cookie(sid, secure))
    _clear_binding(response, secure)
    response.set_cookie(
        Cookie(key=csrf.PRE_COOKIE, value="", path="/", max_age=0, httponly=True, samesite="strict", secure=secure)
    )
    return response


HANDLERS = [sso_start, sso_callback]
