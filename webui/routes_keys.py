"""Keys and teams: create (secret shown once), rotate, change expiry, revoke, edit allow-lists and quotas, the keys
expiring soon; create, rename and delete teams."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from litestar import Request, Response, get, post
from litestar.datastructures import FormMultiDict
from litestar.di import Provide
from sqlalchemy.engine import Engine

from appliance.accounts.keys import ApiKey, KeyRing
from appliance.accounts.labels import key_label
from appliance.accounts.lifecycle import MAX_OVERLAP_HOURS, expiring_soon
from appliance.accounts.rotation import KeyLifecycle
from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest
from appliance.metering.admin import QuotaService
from appliance.serving.names import ModelNames
from appliance.settings import Settings
from appliance.webui import forms, key_table
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import TemplateContext, page, partial

TEXT_LIMIT = 128
QUOTA_FIELDS = (
    ("requests_per_minute", "Requests / min"),
    ("tokens_per_minute", "Tokens / min"),
    ("tokens_per_day", "Tokens / day"),
    ("tokens_per_month", "Tokens / month"),
    ("cost_per_month", "Cost / month"),
    ("max_concurrent", "Concurrent"),
)


OVERLAP_CHOICES = (0, 1, 24, 72, MAX_OVERLAP_HOURS)  # hours the old secret keeps working after a rotation


@dataclass(frozen=True)
class CreatedKey:
    """A key just created or rotated, with its secret: shown once, never stored."""

    row: ApiKey
    secret: str
    old_prefix: str | None = None  # rotated: the old secret's prefix,
    old_valid_until: float | None = None  # and when it stops working


def keys_context(
    request: Request,
    keyring: KeyRing,
    lifecycle: KeyLifecycle,
    quotas: QuotaService,
    names: ModelNames,
    db: Engine,
    settings: Settings,
    *,
    created: CreatedKey | None = None,
    message: str | None = None,
) -> TemplateContext:
    show_all = request.query_params.get("all") == "1"
    teams = quotas.list_teams()
    team_names = {t["id"]: t["name"] for t in teams}
    models = sorted({str(e["id"]) for e in names.listing()})
    spend = key_table.month_spend(db)
    now = time.time()
    live = keyring.list()
    rows = []
    for key in keyring.list(include_revoked=True) if show_all else live:
        quota = quotas.get_quota(f"key:{key.id}")
        allowed = json.loads(key.allowed_models) if key.allowed_models else []
        rows.append(
            {
                "key": key,
                "team": team_names.get(key.team_id),
                "allowed": allowed,
                "stale": [m for m in allowed if m not in models],
                "limits": quota["limits"],
                "windows": key_table.limit_views(quota),
                "spend": key_table.key_spend(spend.get(key.id), quota),  # type: ignore[arg-type]
            }
        )
    for team in teams:
        team_quota = quotas.get_quota(f"team:{team['name']}")
        team["limits"] = team_quota["limits"]
        team["windows"] = key_table.limit_views(team_quota)
    return {
        "rows": rows,
        "teams": teams,
        "models": models,
        "show_all": show_all,
        "quota_fields": QUOTA_FIELDS,
        "created": created,
        "message": message,
        "currency": settings.currency,
        "month_start": key_table.month_start(),
        "expiring": expiring_soon(live, lifecycle.in_overlap(now), now),
        "overlap_choices": OVERLAP_CHOICES,
    }


@get("/keys", include_in_schema=False, sync_to_thread=True)
def keys_page(
    request: Request,
    keyring: KeyRing,
    lifecycle: KeyLifecycle,
    quotas: QuotaService,
    names: ModelNames,
    db: Engine,
    settings: Settings,
) -> Response:
    context = keys_context(request, keyring, lifecycle, quotas, names, db, settings)
    return page(request, "keys.html", active="keys", **context)


class KeysView:
    """What the keys-and-teams fragment is drawn from; handlers name it as their ``keys_view`` parameter."""

    def __init__(
        self, keyring: KeyRing, lifecycle: KeyLifecycle, quotas: QuotaService, names: ModelNames, db: Engine, settings: Settings
    ):
        self.keyring, self.lifecycle, self.quotas, self.names = keyring, lifecycle, quotas, names
        self.db, self.settings = db, settings

    def fragment(self, request: Request, *, created: CreatedKey | None = None, message: str | None = None) -> Response:
        """The keys-and-teams fragment an action answers with."""
        context = keys_context(
            request,
            self.keyring,
            self.lifecycle,
            self.quotas,
            self.names,
            self.db,
            self.settings,
            created=created,
            message=message,
        )
        return partial(request, "_keys.html", **context)


KEYS_VIEW = {"keys_view": Provide(KeysView, sync_to_thread=False)}


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


@post("/keys/create", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def create_key(request: Request, keyring: KeyRing, keys_view: KeysView, audit: AuditTrail, user: ConsoleUser) -> Response:
    form = await request.form()
    name = forms.optional(form, "name", TEXT_LIMIT)
    if not name:
        raise BadRequest("Give the key a name.", param="name")
    row, secret = keyring.create(
        name,
        role=forms.optional(form, "role", TEXT_LIMIT) or "user",
        team_id=_team_id(form),
        priority=forms.optional(form, "priority", TEXT_LIMIT) or "interactive",
        allowed_models=_allowed(form),
        expires_at=_expiry(form),
    )
    audit.record(user.actor, "key.create", row.prefix, f"name={row.name} role={row.role}")
    return keys_view.fragment(request, created=CreatedKey(row, secret))


@post("/keys/{key_id:int}/revoke", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def revoke_key(
    request: Request, key_id: int, keyring: KeyRing, keys_view: KeysView, audit: AuditTrail, user: ConsoleUser
) -> Response:
    row = keyring.revoke(key_id)
    audit.record(user.actor, "key.revoke", row.prefix)
    return keys_view.fragment(request, message=f"Revoked {row.prefix}…; it stops working at once.")


@post("/keys/{key_id:int}/update", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def update_key(
    request: Request, key_id: int, keyring: KeyRing, keys_view: KeysView, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    changes: dict[str, str | int | list[str] | None] = {"allowed_models": _allowed(form)}
    for field in ("name", "priority"):
        if forms.optional(form, field, TEXT_LIMIT):
            changes[field] = forms.optional(form, field, TEXT_LIMIT)
    changes["team_id"] = _team_id(form)
    row = keyring.update(key_id, **changes)
    audit.record(user.actor, "key.update", row.prefix, ",".join(sorted(changes)))
    return keys_view.fragment(request, message=f"Saved {row.prefix}….")


def _expiry(form: FormMultiDict) -> float | None:
    """The moment ``expires_in_days`` days from now; None when the field is empty."""
    days = forms.optional(form, "expires_in_days", TEXT_LIMIT)
    try:
        return time.time() + float(days) * 86400 if days else None
    except ValueError:
        raise BadRequest("expiry must be a number of days", param="expires_in_days") from None


@post("/keys/{key_id:int}/rotate", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def rotate_key(
    request: Request, key_id: int, lifecycle: KeyLifecycle, keys_view: KeysView, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    raw = forms.optional(form, "overlap_hours", TEXT_LIMIT) or "0"
    try:
        hours = float(raw)
    except ValueError:
        raise BadRequest("overlap must be a number of hours", param="overlap_hours") from None
    row, secret, old = lifecycle.rotate(key_id, hours)
    audit.record(user.actor, "key.rotate", row.prefix, f"old={old.prefix} overlap_hours={hours:g}")
    return keys_view.fragment(request, created=CreatedKey(row, secret, old.prefix, old.valid_until))


@post("/keys/{key_id:int}/expiry", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def set_expiry(
    request: Request, key_id: int, lifecycle: KeyLifecycle, keys_view: KeysView, audit: AuditTrail, user: ConsoleUser
) -> Response:
    """Set the expiry ``expires_in_days`` from now, or clear it (``never``)."""
    form = await request.form()
    expires = None if forms.optional(form, "never", TEXT_LIMIT) else _expiry(form)
    if expires is None and not forms.optional(form, "never", TEXT_LIMIT):
        raise BadRequest("Give a number of days, or choose never.", param="expires_in_days")
    row = lifecycle.set_expiry(key_id, expires, "expires_in_days")
    audit.record(user.actor, "key.expiry", row.prefix, f"expires_at={row.expires_at}")
    label = key_label(row.name, row.prefix)
    return keys_view.fragment(request, message=f"{label} now never expires." if expires is None else f"Expiry of {label} saved.")


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


@post("/quotas/{subject:str}", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def set_quota(request: Request, subject: str, quotas: QuotaService, keys_view: KeysView, user: ConsoleUser) -> Response:
    form = await request.form()
    if not subject.startswith(("key:", "team:")):
        raise BadRequest("unknown quota subject", param="subject")
    result = quotas.set_quota(subject, _quota_changes(form), user.actor)
    return keys_view.fragment(request, message=f"Quota of {result['label']} saved.")


@post("/teams/create", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def create_team(request: Request, quotas: QuotaService, keys_view: KeysView, user: ConsoleUser) -> Response:
    form = await request.form()
    team = quotas.create_team(forms.optional(form, "name", 64) or "", user.actor)
    return keys_view.fragment(request, message=f"Team {team['name']} created.")


@post("/teams/{name:str}/rename", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def rename_team(request: Request, name: str, quotas: QuotaService, keys_view: KeysView, user: ConsoleUser) -> Response:
    form = await request.form()
    team = quotas.rename_team(name, forms.optional(form, "name", 64) or "", user.actor)
    return keys_view.fragment(request, message=f"Team {name} is now {team['name']}; its keys, limits and usage follow.")


@post("/teams/{name:str}/delete", guards=[needs("admin")], dependencies=KEYS_VIEW, include_in_schema=False)
async def delete_team(request: Request, name: str, quotas: QuotaService, keys_view: KeysView, user: ConsoleUser) -> Response:
    """Delete a team without live keys (a team with some is refused: see ``QuotaService.delete_team``)."""
    team = quotas.delete_team(name, user.actor)
    return keys_view.fragment(request, message=f"Team {team['name']} deleted; its past usage stays in the reports.")


HANDLERS = [
    keys_page,
    create_key,
    revoke_key,
    update_key,
    rotate_key,
    set_expiry,
    set_quota,
    create_team,
    rename_team,
    delete_team,
]
