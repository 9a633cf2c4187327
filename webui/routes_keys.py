"""Keys and teams: create (secret shown once), revoke, edit allow-lists and quotas; teams."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from litestar import Request, Response, get, post
from litestar.datastructures import FormMultiDict

from appliance.accounts.keys import ApiKey, KeyRing
from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest
from appliance.metering.admin import QuotaService
from appliance.serving.names import ModelNames
from appliance.webui import forms
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import page, partial

TEXT_LIMIT = 128
QUOTA_FIELDS = (
    ("requests_per_minute", "Requests / min"),
    ("tokens_per_minute", "Tokens / min"),
    ("tokens_per_day", "Tokens / day"),
    ("tokens_per_month", "Tokens / month"),
    ("cost_per_month", "Cost / month"),
    ("max_concurrent", "Concurrent"),
)


@dataclass(frozen=True)
class CreatedKey:
    """A key just created, with its secret: shown once, never stored."""

    row: ApiKey
    secret: str


def keys_context(request: Request, keyring: KeyRing, quotas: QuotaService, names: ModelNames, *,
                 created: CreatedKey | None = None, message: str | None = None) -> dict[str, object]:
    show_all = request.query_params.get("all") == "1"
    teams = quotas.list_teams()
    team_names = {t["id"]: t["name"] for t in teams}
    rows = []
    for key in keyring.list(include_revoked=show_all):
        rows.append({
            "key": key, "team": team_names.get(key.team_id),
            "allowed": json.loads(key.allowed_models) if key.allowed_models else [],
            "limits": quotas.get_quota(f"key:{key.id}")["limits"],
        })
    for team in teams:
        team["limits"] = quotas.get_quota(f"team:{team['name']}")["limits"]
    return {"rows": rows, "teams": teams, "models": sorted({e["id"] for e in names.listing()}), "show_all": show_all,
            "quota_fields": QUOTA_FIELDS, "created": created, "message": message}


@get("/keys", include_in_schema=False, sync_to_thread=True)
def keys_page(request: Request, keyring: KeyRing, quotas: QuotaService, names: ModelNames) -> Response:
    return page(request, "keys.html", active="keys", **keys_context(request, keyring, quotas, names))


def _keys(request: Request, keyring: KeyRing, quotas: QuotaService, names: ModelNames, *,
          created: CreatedKey | None = None, message: str | None = None) -> Response:
    """The keys-and-teams fragment an action answers with."""
    return partial(request, "_keys.html", **keys_context(request, keyring, quotas, names, created=created, message=message))


def _allowed(form: FormMultiDict) -> list[str] | None:
    chosen = [v.strip() for v in form.getall("allowed_models", []) if isinstance(v, str) and v.strip()]
    extra = forms.optional(form, "allowed_extra", 2000)
    if extra:
        chosen += [p.strip() for p in extra.replace("\n", ",").split(",") if p.strip()]
    return sorted(set(chosen)) or None


def _team_id(form: FormMultiDict) -> int | None:
    raw = forms.optional(form, "team_id", TEXT_LIMIT)
    if raw is None:
        return None
    if not raw.isdigit():
        raise BadRequest("team must be one of the listed teams", param="team_id")
    return int(raw)


@post("/keys/create", guards=[needs("admin")], include_in_schema=False)
async def create_key(request: Request, keyring: KeyRing, quotas: QuotaService, names: ModelNames, audit: AuditTrail,
                     user: ConsoleUser) -> Response:
    form = await request.form()
    name = forms.optional(form, "name", TEXT_LIMIT)
    if not name:
        raise BadRequest("Give the key a name.", param="name")
    days = forms.optional(form, "expires_in_days", TEXT_LIMIT)
    try:
        expires = time.time() + float(days) * 86400 if days else None
    except ValueError:
        raise BadRequest("expiry must be a number of days", param="expires_in_days") from None
    row, secret = keyring.create(
        name, role=forms.optional(form, "role", TEXT_LIMIT) or "user", team_id=_team_id(form),
        priority=forms.optional(form, "priority", TEXT_LIMIT) or "interactive", allowed_models=_allowed(form), expires_at=expires)
    audit.record(user.actor, "key.create", row.prefix, f"name={row.name} role={row.role}")
    return _keys(request, keyring, quotas, names, created=CreatedKey(row, secret))


@post("/keys/{key_id:int}/revoke", guards=[needs("admin")], include_in_schema=False)
async def revoke_key(request: Request, key_id: int, keyring: KeyRing, quotas: QuotaService, names: ModelNames,
                     audit: AuditTrail, user: ConsoleUser) -> Response:
    row = keyring.revoke(key_id)
    audit.record(user.actor, "key.revoke", row.prefix)
    return _keys(request, keyring, quotas, names, message=f"Revoked {row.prefix}…; it stops working at once.")


@post("/keys/{key_id:int}/update", guards=[needs("admin")], include_in_schema=False)
async def update_key(request: Request, key_id: int, keyring: KeyRing, quotas: QuotaService, names: ModelNames,
                     audit: AuditTrail, user: ConsoleUser) -> Response:
    form = await request.form()
    changes: dict[str, str | int | list[str] | None] = {"allowed_models": _allowed(form)}
    for field in ("name", "priority"):
        if forms.optional(form, field, TEXT_LIMIT):
            changes[field] = forms.optional(form, field, TEXT_LIMIT)
    changes["team_id"] = _team_id(form)
    row = keyring.update(key_id, **changes)
    audit.record(user.actor, "key.update", row.prefix, ",".join(sorted(changes)))
    return _keys(request, keyring, quotas, names, message=f"Saved {row.prefix}….")


def _quota_changes(form: FormMultiDict) -> dict[str, float | int | None]:
    changes: dict[str, float | int | None] = {}
    for field, label in QUOTA_FIELDS:
        raw = forms.optional(form, field, 32)
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
async def set_quota(request: Request, subject: str, keyring: KeyRing, quotas: QuotaService, names: ModelNames,
                    user: ConsoleUser) -> Response:
    form = await request.form()
    if not subject.startswith(("key:", "team:")):
        raise BadRequest("unknown quota subject", param="subject")
    result = quotas.set_quota(subject, _quota_changes(form), user.actor)
    return _keys(request, keyring, quotas, names, message=f"Quota of {result['subject']} saved.")


@post("/teams/create", guards=[needs("admin")], include_in_schema=False)
async def create_team(request: Request, keyring: KeyRing, quotas: QuotaService, names: ModelNames, user: ConsoleUser) -> Response:
    form = await request.form()
    team = quotas.create_team(forms.optional(form, "name", 64) or "", user.actor)
    return _keys(request, keyring, quotas, names, message=f"Team {team['name']} created.")


HANDLERS = [keys_page, create_key, revoke_key, update_key, set_quota, create_team]
