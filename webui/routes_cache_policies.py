"""Cache policies of teams and keys: set or clear a subject's override from the cache page.

An override names only the fields it changes; every other field is inherited
(defaults ← global ← team ← key, and `enabled: off` anywhere wins). Changes go
through :func:`appliance.cache.subjects.set_subject_policy`, as
``PUT /admin/cache/policy`` does: validated, stored, audited. Admins only.
"""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import FormMultiDict
from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing
from appliance.accounts.labels import key_label
from appliance.cache.responses import ResponseCache
from appliance.cache.subjects import Scope, set_subject_policy
from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import Team
from appliance.errors import BadRequest, NotFound
from appliance.jsontypes import JsonObject
from appliance.settings import Settings
from appliance.webui import forms
from appliance.webui.admin_forms import field_errors
from appliance.webui.cache_view import POLICY_FLAGS, SHARE_MODES, cache_context
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import partial

TRI_STATE = {"on": True, "off": False}
SUBJECT_KINDS: dict[str, Scope] = {"team": "team", "key": "key"}


def _subject(form: FormMultiDict) -> tuple[Scope, str]:
    """``team:<id>`` or ``key:<id>`` from the subject field."""
    raw = forms.required(form, "subject", 64)
    kind, _, ident = raw.partition(":")
    scope = SUBJECT_KINDS.get(kind)
    if scope is None or not ident.isdigit():
        raise BadRequest("Choose a team or a key.", param="subject")
    return scope, ident


def _override(form: FormMultiDict) -> JsonObject | None:
    """The fields the form sets; None when it sets none (the subject then inherits everything)."""
    policy: JsonObject = {}
    for field, _label in POLICY_FLAGS:
        choice = str(form.get(field) or "inherit")
        if choice in TRI_STATE:
            policy[field] = TRI_STATE[choice]
        elif choice != "inherit":
            raise BadRequest(f"{field} must be inherit, on or off.", param=field)
    threshold = forms.number(form, "semantic_threshold", float, 0.5, 1.0)
    if threshold is not None:
        policy["semantic_threshold"] = threshold
    share = str(form.get("share") or "inherit")
    if share in SHARE_MODES:
        policy["share"] = share
    elif share != "inherit":
        raise BadRequest(f"share must be inherit or one of {', '.join(SHARE_MODES)}.", param="share")
    return policy or None


def _answer(
    request: Request,
    cache: ResponseCache,
    db: Engine,
    settings: Settings,
    keyring: KeyRing,
    *,
    message: str | None = None,
    errors: dict[str, str] | None = None,
) -> Response:
    return partial(request, "_cache.html", **cache_context(cache, db, settings, keyring, errors=errors, policy_message=message))


def _label(scope: Scope, subject: int | None, keyring: KeyRing, db: Engine) -> str:
    """How the page names the subject: ``team:<name>``, or a key as ``name (prefix…)``."""
    if scope == "key" and subject is not None:
        key = keyring.get(subject)
        return key_label(key.name, key.prefix, key.id)
    with session(db) as s:
        team = s.get(Team, subject)
    return f"team:{team.name}" if team is not None else f"team:{subject}"


@post("/cache/policies/set", guards=[needs("admin")], include_in_schema=False)
async def set_override(
    request: Request, cache: ResponseCache, db: Engine, settings: Settings, keyring: KeyRing, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    try:
        scope, ident = _subject(form)
        policy = _override(form)
        subject, _stored = set_subject_policy(cache, keyring, db, audit, user.actor, scope, ident, policy)
    except (BadRequest, NotFound) as exc:
        errors = field_errors(exc, "subject") if isinstance(exc, BadRequest) else {"subject": exc.message}
        return _answer(request, cache, db, settings, keyring, errors=errors)
    label = _label(scope, subject, keyring, db)
    return _answer(
        request,
        cache,
        db,
        settings,
        keyring,
        message=f"Cache policy of {label} saved." if policy else f"{label} now inherits its cache policy.",
    )


@post("/cache/policies/clear", guards=[needs("admin")], include_in_schema=False)
async def clear_override(
    request: Request, cache: ResponseCache, db: Engine, settings: Settings, keyring: KeyRing, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    try:
        scope, ident = _subject(form)
        subject, _stored = set_subject_policy(cache, keyring, db, audit, user.actor, scope, ident, None)
    except (BadRequest, NotFound) as exc:
        return _answer(request, cache, db, settings, keyring, errors={"subject": exc.message})
    return _answer(
        request, cache, db, settings, keyring, message=f"{_label(scope, subject, keyring, db)} now inherits its cache policy."
    )


HANDLERS = [set_override, clear_override]
