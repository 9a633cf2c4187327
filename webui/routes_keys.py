"""Keys and teams: create (secret shown once), revoke, edit allow-lists and quotas; teams."""

from __future__ import annotations

import json
import time
from typing import Any

from litestar import Request, Response, get, post

from appliance.errors import BadRequest
from appliance.webui.context import audit, require_user, services
from appliance.webui.gate import needs
from appliance.webui.render import page, partial

QUOTA_FIELDS = (
    ("requests_per_minute", "Requests / min"),
    ("tokens_per_minute", "Tokens / min"),
    ("tokens_per_day", "Tokens / day"),
    ("tokens_per_month", "Tokens / month"),
    ("cost_per_month", "Cost / month"),
    ("max_concurrent", "Concurrent"),
)


def quota_service(request: Request) -> Any:
    svc = services(request)
    found = getattr(svc, "quotas", None)
    if found is not None:
        return found
    from appliance.metering.admin import QuotaService

    return QuotaService(svc.db, getattr(svc, "meter", None))


def _limits(request: Request, subject: str) -> dict[str, Any]:
    try:
        return quota_service(request).get_quota(subject)["limits"]
    except Exception:  # quotas not set up: show no limits rather than fail the page
        return {}


def _models(request: Request) -> list[str]:
    try:
        return sorted({e["id"] for e in services(request).model_names()})
    except Exception:
        return []


def keys_context(request: Request, created: dict[str, Any] | None = None, message: str | None = None) -> dict[str, Any]:
    show_all = request.query_params.get("all") == "1"
    keyring = services(request).keyring
    teams = quota_service(request).list_teams()
    team_names = {t["id"]: t["name"] for t in teams}
    rows = []
    for key in keyring.list(include_revoked=show_all):
        rows.append({
            "key": key, "team": team_names.get(key.team_id),
            "allowed": json.loads(key.allowed_models) if key.allowed_models else [],
            "limits": _limits(request, f"key:{key.id}"),
        })
    for team in teams:
        team["limits"] = _limits(request, f"team:{team['name']}")
    return {"rows": rows, "teams": teams, "models": _models(request), "show_all": show_all, "quota_fields": QUOTA_FIELDS,
            "created": created, "message": message}


@get("/keys", include_in_schema=False, sync_to_thread=True)
def keys_page(request: Request) -> Response:
    return page(request, "keys.html", active="keys", **keys_context(request))


def _text(form: Any, name: str, limit: int = 128) -> str | None:
    value = form.get(name)
    value = value.strip() if isinstance(value, str) else ""
    if len(value) > limit:
        raise BadRequest(f"{name} is too long.", param=name)
    return value or None


def _allowed(form: Any) -> list[str] | None:
    chosen = [v.strip() for v in form.getall("allowed_models", []) if isinstance(v, str) and v.strip()]
    extra = _text(form, "allowed_extra", 2000)
    if extra:
        chosen += [p.strip() for p in extra.replace("\n", ",").split(",") if p.strip()]
    return sorted(set(chosen)) or None


def _team_id(form: Any) -> int | None:
    raw = _text(form, "team_id")
    if raw is None:
        return None
    if not raw.isdigit():
        raise BadRequest("team must be one of the listed teams", param="team_id")
    return int(raw)


@post("/keys/create", guards=[needs("admin")], include_in_schema=False)
async def create_key(request: Request) -> Response:
    form = await request.form()
    name = _text(form, "name")
    if not name:
        raise BadRequest("Give the key a name.", param="name")
    days = _text(form, "expires_in_days")
    try:
        expires = time.time() + float(days) * 86400 if days else None
    except ValueError:
        raise BadRequest("expiry must be a number of days", param="expires_in_days") from None
    row, secret = services(request).keyring.create(
        name, role=_text(form, "role") or "user", team_id=_team_id(form), priority=_text(form, "priority") or "interactive",
        allowed_models=_allowed(form), expires_at=expires)
    audit(request, "key.create", row.prefix, f"name={row.name} role={row.role}")
    return partial(request, "_keys.html", **keys_context(request, created={"row": row, "secret": secret}))


@post("/keys/{key_id:int}/revoke", guards=[needs("admin")], include_in_schema=False)
async def revoke_key(request: Request, key_id: int) -> Response:
    row = services(request).keyring.revoke(key_id)
    audit(request, "key.revoke", row.prefix)
    return partial(request, "_keys.html", **keys_context(request, message=f"Revoked {row.prefix}…; it stops working at once."))


@post("/keys/{key_id:int}/update", guards=[needs("admin")], include_in_schema=False)
async def update_key(request: Request, key_id: int) -> Response:
    form = await request.form()
    changes: dict[str, Any] = {"allowed_models": _allowed(form)}
    for field in ("name", "priority"):
        if _text(form, field):
            changes[field] = _text(form, field)
    changes["team_id"] = _team_id(form)
    row = services(request).keyring.update(key_id, **changes)
    audit(request, "key.update", row.prefix, ",".join(sorted(changes)))
    return partial(request, "_keys.html", **keys_context(request, message=f"Saved {row.prefix}…."))


def _quota_changes(form: Any) -> dict[str, float | int | None]:
    changes: dict[str, float | int | None] = {}
    for field, label in QUOTA_FIELDS:
        raw = _text(form, field, 32)
        if raw is None:
            changes[field] = None
            continue
        try:
            value = float(raw)
        except ValueError:
            raise BadRequest(f"{label} must be a number, or empty for no limit.", param=field) from None
        changes[field] = value if field == "cost_per_month" else int(value) if value.is_integer() else value
    return changes


@post("/quotas/{subject:str}", guards=[needs("admin")], include_in_schema=False)
async def set_quota(request: Request, subject: str) -> Response:
    form = await request.form()
    if not subject.startswith(("key:", "team:")):
        raise BadRequest("unknown quota subject", param="subject")
    result = quota_service(request).set_quota(subject, _quota_changes(form), require_user(request).actor)
    return partial(request, "_keys.html", **keys_context(request, message=f"Quota of {result['subject']} saved."))


@post("/teams/create", guards=[needs("admin")], include_in_schema=False)
async def create_team(request: Request) -> Response:
    form = await request.form()
    team = quota_service(request).create_team(_text(form, "name", 64) or "", require_user(request).actor)
    return partial(request, "_keys.html", **keys_context(request, message=f"Team {team['name']} created."))


HANDLERS = [keys_page, create_key, revoke_key, update_key, set_quota, create_team]
