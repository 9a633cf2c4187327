"""Cache (stats, global policy, purge), audit log (filtered, paged, CSV export), console users (settings: ``routes_settings``)."""

from __future__ import annotations

import secrets
import time
from urllib.parse import urlencode

import anyio
from litestar import Request, Response, get, post
from litestar.response import Stream
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import col

from appliance.accounts import user_admin
from appliance.accounts.keys import KeyRing
from appliance.accounts.labels import key_label
from appliance.accounts.users import ROLES, create_user, generate_password, hash_password
from appliance.api.audit import audit_filter, csv_response
from appliance.cache.responses import ResponseCache
from appliance.cache.subjects import set_subject_policy
from appliance.db.audit import AuditFilter, AuditTrail, filter_choices, read_page
from appliance.db.engine import session
from appliance.db.tables import ApiKey, AuditLog, User
from appliance.errors import BadRequest
from appliance.settings import Settings
from appliance.webui.cache_view import cache_context
from appliance.webui.context import Console, ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import TemplateContext, page, partial

AUDIT_PAGE = 100
AUDIT_PARAMS = ("from", "to", "actor", "action", "q")


# ------------------------------------------------------------------ cache
@get("/cache", include_in_schema=False, sync_to_thread=True)
def cache_page(request: Request, cache: ResponseCache, db: Engine, settings: Settings, keyring: KeyRing) -> Response:
    return page(request, "cache.html", active="cache", **cache_context(cache, db, settings, keyring))


@post("/cache/purge", guards=[needs("admin")], include_in_schema=False)
async def cache_purge(
    request: Request, cache: ResponseCache, db: Engine, settings: Settings, keyring: KeyRing, audit: AuditTrail, user: ConsoleUser
) -> Response:
    model = str((await request.form()).get("model") or "").strip() or None
    removed = await anyio.to_thread.run_sync(lambda: cache.purge(model=model))
    audit.record(user.actor, "cache.purge", model or "*", f"removed={removed}")
    return partial(
        request, "_cache.html", **cache_context(cache, db, settings, keyring, f"Cache purged: {removed} entries removed.")
    )


@post("/cache/policy", guards=[needs("admin")], include_in_schema=False)
async def cache_policy(
    request: Request, cache: ResponseCache, db: Engine, settings: Settings, keyring: KeyRing, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    try:
        threshold = float(form.get("semantic_threshold") or 0.95)
    except ValueError:
        raise BadRequest("The similarity threshold must be a number.", param="semantic_threshold") from None
    share = str(form.get("share") or "team")
    policy = {
        "enabled": form.get("enabled") == "on",
        "cache_nondeterministic": form.get("cache_nondeterministic") == "on",
        "semantic": form.get("semantic") == "on",
        "semantic_threshold": threshold,
        "share": share,
    }
    set_subject_policy(cache, keyring, db, audit, user.actor, "global", None, policy)
    return partial(request, "_cache.html", **cache_context(cache, db, settings, keyring, "Cache policy saved."))


# ------------------------------------------------------------------ audit
def _audit_filter(request: Request) -> AuditFilter:
    params = request.query_params
    return audit_filter(
        time.time(),
        start=params.get("from"),
        to=params.get("to"),
        actor=params.get("actor"),
        action=params.get("action"),
        text=params.get("q"),
    )


def _key_labels(db: Engine, rows: list[AuditLog]) -> dict[str, str]:
    """``name (prefix…)`` for the keys the rows name: key actions' targets and ``key:<prefix>`` actors."""
    prefixes = {r.target for r in rows if r.action.startswith("key.") and r.target}
    prefixes |= {r.actor[4:] for r in rows if r.actor.startswith("key:")}
    if not prefixes:
        return {}
    with session(db) as s:
        found = s.execute(select(col(ApiKey.prefix), col(ApiKey.name)).where(col(ApiKey.prefix).in_(prefixes))).all()
    return {prefix: key_label(name, prefix) for prefix, name in found}


@get("/audit", include_in_schema=False, sync_to_thread=True)
def audit_page(request: Request, db: Engine) -> Response:
    """The audit log, newest first, filtered by date range, actor, action and text, a page at a time."""
    shown = {k: (request.query_params.get(k) or "").strip()[:64] for k in AUDIT_PARAMS}
    actors, actions = filter_choices(db)
    error = None
    try:
        filters = _audit_filter(request)
    except BadRequest as exc:
        filters, error = AuditFilter(), exc.message
    after = request.query_params.get("after", "")
    result = read_page(db, filters, after=int(after) if after.isdigit() else None, limit=AUDIT_PAGE) if error is None else None
    query = urlencode({k: v for k, v in shown.items() if v})
    return page(
        request,
        "audit.html",
        active="audit",
        rows=result.rows if result else [],
        key_labels=_key_labels(db, result.rows) if result else {},
        shown=shown,
        actors=actors,
        actions=actions,
        error=error,
        query=query,
        paged=after.isdigit(),
        next_after=result.next_after if result else None,
    )


@get("/audit.csv", guards=[needs("admin")], include_in_schema=False)
async def audit_csv(request: Request, db: Engine) -> Stream:
    """The rows the page's filters match, every page of them, as CSV (admins only)."""
    return csv_response(db, _audit_filter(request), time.time())


# ------------------------------------------------------------------ users
def _one_time(username: str, password: str) -> dict[str, str]:
    """A one-time password to show once, with an id of its own for its card (a user may get several)."""
    return {"username": username, "password": password, "card": secrets.token_hex(4)}


def _users(db: Engine, message: str | None = None, one_time: dict[str, str] | None = None) -> TemplateContext:
    """The users table; ``one_time`` (a new one-time password) is appended to the page's list of them, which
    the table's own updates leave alone, so each stays on screen until dismissed."""
    with session(db) as s:
        users = list(s.execute(select(User).order_by(User.username)).scalars())
    return {"users": users, "roles": ROLES, "message": message, "one_time": one_time}


@get("/users", guards=[needs("admin")], include_in_schema=False, sync_to_thread=True)
def users_page(request: Request, db: Engine) -> Response:
    return page(request, "users.html", active="users", **_users(db))


@post("/users/create", guards=[needs("admin")], include_in_schema=False)
async def users_create(request: Request, db: Engine, audit: AuditTrail, user: ConsoleUser) -> Response:
    form = await request.form()
    username = str(form.get("username") or "").strip()
    role = str(form.get("role") or "viewer")
    password = generate_password(username)
    create_user(db, username, password, role=role, must_change_password=True)
    audit.record(user.actor, "user.create", username, f"role={role}")
    return partial(request, "_users.html", **_users(db, f"{username} added as {role}.", one_time=_one_time(username, password)))


@post("/users/{user_id:int}/role", guards=[needs("admin")], include_in_schema=False)
async def users_role(request: Request, user_id: int, db: Engine, audit: AuditTrail, user: ConsoleUser) -> Response:
    role = str((await request.form()).get("role") or "")
    row = user_admin.set_role(db, user.id, user_id, role, ROLES)
    audit.record(user.actor, "user.role", row.username, f"role={role}")
    return partial(request, "_users.html", **_users(db, f"{row.username} is now {role}."))


@post("/users/{user_id:int}/disable", guards=[needs("admin")], include_in_schema=False)
async def users_disable(
    request: Request, user_id: int, db: Engine, console: Console, audit: AuditTrail, user: ConsoleUser
) -> Response:
    disabled = (await request.form()).get("disabled") != "false"
    row = user_admin.set_disabled(db, user.id, user_id, disabled)
    if disabled:
        console.sessions.delete_for_user(user_id)
    audit.record(user.actor, "user.disable" if disabled else "user.enable", row.username)
    return partial(request, "_users.html", **_users(db, f"{row.username} {'disabled' if disabled else 'enabled'}."))


@post("/users/{user_id:int}/delete", guards=[needs("admin")], include_in_schema=False)
async def users_delete(
    request: Request, user_id: int, db: Engine, console: Console, audit: AuditTrail, user: ConsoleUser
) -> Response:
    row = user_admin.delete_user(db, user.id, user_id)
    ended = console.sessions.delete_for_user(user_id)
    audit.record(user.actor, "user.delete", row.username, f"role={row.role} sessions_ended={ended}")
    return partial(request, "_users.html", **_users(db, f"{row.username} deleted; their sessions ended."))


@post("/users/{user_id:int}/reset", guards=[needs("admin")], include_in_schema=False)
async def users_reset(
    request: Request, user_id: int, db: Engine, console: Console, audit: AuditTrail, user: ConsoleUser
) -> Response:
    password = generate_password()
    row = user_admin.reset_password(db, user.id, user_id, hash_password(password))
    console.sessions.delete_for_user(user_id)
    audit.record(user.actor, "user.password_reset", row.username)
    return partial(
        request,
        "_users.html",
        **_users(
            db,
            f"{row.username} has a new one-time password.",
            one_time=_one_time(row.username, password),
        ),
    )


HANDLERS = [
    cache_page,
    cache_purge,
    cache_policy,
    audit_page,
    audit_csv,
    users_page,
    users_create,
    users_role,
    users_disable,
    users_delete,
    users_reset,
]
