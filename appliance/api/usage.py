"""Admin API for usage reports, quotas, prices and teams.

Handlers are thin: they parse, call :class:`appliance.metering.admin.QuotaService`
or :func:`appliance.metering.reports.query_usage`, and shape the answer. They read
the database and the quota service by dependency injection, and name the
caller (``actor``) in the audit log. Admin only (``appliance.api.access``).
Register ``CONTROLLERS``.
"""

from __future__ import annotations

import time
from typing import Annotated

from litestar import Controller, Response, delete, get, patch, post, put
from litestar.params import Parameter
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.engine import Engine

from appliance.api.access import Access, requires
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.admin import QuotaService
from appliance.metering.box_figures import BoxFigures, figures_json
from appliance.metering.economics import OwnerRates, box_totals, report_owner_cost
from appliance.metering.reports import parse_by, query_usage, to_csv
from appliance.metering.usage_filters import custom_range, resolve_filters
from appliance.settings import Settings

MAX_COUNT = 10**15
MAX_MONEY = 1e12


class _Numbers(BaseModel):
    """A body of numbers or nulls. Litestar validates pydantic models leniently (``true`` → 1,
    ``"5"`` → 5), so other JSON types are refused here, before any conversion."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_only(cls, data: object) -> object:
        if isinstance(data, dict):
            for name, value in data.items():
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    raise ValueError(f"{name} must be a number or null")
        return data


class QuotaUpdate(_Numbers):
    """Limits to set. A field given as null removes that limit; a field left out keeps its value."""

    requests_per_minute: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    tokens_per_minute: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    tokens_per_day: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    tokens_per_month: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    cost_per_month: float | None = Field(default=None, ge=0, le=MAX_MONEY)
    max_concurrent: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    alert_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Budget alert threshold (%), in place of the budget_alert_thresholds setting; null: the setting's; 0: none.",
    )


class PriceUpdate(_Numbers):
    """Rates per million tokens. Fields left out keep their value (zero for a new price)."""

    input_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)
    output_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)
    cached_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)


class TeamCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class UsageController(Controller):
    path = "/admin/usage"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def usage(
        self,
        db: Engine,
        settings: Settings,
        since: str | None = None,
        until: str | None = None,
        start: Annotated[str | None, Parameter(query="from")] = None,
        to: str | None = None,
        key: str | None = None,
        team: str | None = None,
        model: Annotated[str | None, Parameter(max_length=200)] = None,
        by: str | None = None,
        fmt: Annotated[str, Parameter(query="format", pattern="^(json|csv)$")] = "json",
    ) -> Response:
        """Usage totals between ``from`` and ``to`` (default: the last 30 days), grouped by key, team, model, day or hour.

        ``from``/``to`` take epoch seconds, ISO 8601 or an age such as ``7d``; a bare date as ``to``
        includes that day. ``since``/``until`` are the older names of ``from``/``to`` (``until`` excludes
        a bare date). ``team`` (name), ``key`` (prefix or id) and ``model`` (a family matches its
        variants) must name a team, key or model the appliance knows, or the answer is a 400 naming it."""
        now = time.time()
        if start is not None and since is not None:
            raise BadRequest("Give from or since, not both.", param="from")
        if to is not None and until is not None:
            raise BadRequest("Give to or until, not both.", param="to")
        begin, end = custom_range(
            start if start is not None else since,
            to if to is not None else until,
            now,
            start_param="since" if start is None else "from",
            end_param="until" if to is None else "to",
            end_excludes_date=to is None,
        )
        filters = resolve_filters(db, since=begin, until=end, team=team, key=key, model=model)
        report = query_usage(
            db,
            since=filters.since,
            until=filters.until,
            key_id=filters.key_id,
            team_id=filters.team_id,
            model=filters.model,
            by=parse_by(by),
            now=now,
        )
        rates = OwnerRates.of(settings)
        if rates.known:
            report = report_owner_cost(report, rates, box_totals(db, report["since"], report["until"]), now)
        if fmt == "csv":
            return Response(
                to_csv(report), media_type="text/csv", headers={"content-disposition": 'attachment; filename="usage.csv"'}
            )
        return Response({**report, "currency": settings.currency})

    @get("/box", sync_to_thread=True)
    def box(self, figures: BoxFigures, settings: Settings) -> JsonObject:
        """The box now, per window (5m, 1h, 1d): latency-target attainment per model and class, tokens produced,
        each engine's busy share and headroom, and the owner's cost per million tokens (read from the ledger at
        most every 10 s, less often for a large ledger: see :mod:`appliance.metering.box_figures`)."""
        return {"currency": settings.currency, "windows": figures_json(figures)}


class QuotaController(Controller):
    path = "/admin/quotas"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get("/{subject:str}", sync_to_thread=True)
    def show_quota(self, quotas: QuotaService, subject: str) -> JsonObject:
        """Limits of ``key:<id or prefix>`` or ``team:<name>`` and its counters in the current windows."""
        return quotas.get_quota(subject)

    @put("/{subject:str}", sync_to_thread=True)
    def set_quota(self, quotas: QuotaService, subject: str, data: QuotaUpdate, actor: str) -> JsonObject:
        """Set limits; null removes one, a field left out keeps its value."""
        changes = data.model_dump(include=data.model_fields_set)
        return quotas.set_quota(subject, changes, actor)

    @delete("/{subject:str}", sync_to_thread=True)
    def remove_quota(self, quotas: QuotaService, subject: str, actor: str) -> None:
        """Remove every limit of a key or team."""
        quotas.delete_quota(subject, actor)


class PriceController(Controller):
    path = "/admin/prices"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def list_prices(self, quotas: QuotaService) -> list[JsonObject]:
        """Every price row."""
        return quotas.list_prices()

    @get("/{model:str}", sync_to_thread=True)
    def show_price(self, quotas: QuotaService, model: str) -> JsonObject:
        """Price of ``*``, a family, or ``family:variant``."""
        return quotas.get_price(model)

    @put("/{model:str}", sync_to_thread=True)
    def set_price(self, quotas: QuotaService, model: str, data: PriceUpdate, actor: str) -> JsonObject:
        """Set rates per million tokens (input, output, cached)."""
        changes = {k: v for k, v in data.model_dump(include=data.model_fields_set).items() if v is not None}
        return quotas.set_price(model, changes, actor)

    @delete("/{model:str}", sync_to_thread=True)
    def remove_price(self, quotas: QuotaService, model: str, actor: str) -> None:
        quotas.delete_price(model, actor)


class TeamController(Controller):
    path = "/admin/teams"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def list_teams(self, quotas: QuotaService) -> list[JsonObject]:
        """Teams with their number of live keys."""
        return quotas.list_teams()

    @post(sync_to_thread=True)
    def create_team(self, quotas: QuotaService, data: TeamCreate, actor: str) -> JsonObject:
        return quotas.create_team(data.name, actor)

    @patch("/{name:str}", sync_to_thread=True)
    def rename_team(self, quotas: QuotaService, name: str, data: TeamCreate, actor: str) -> JsonObject:
        """Rename a team; its keys, limits, cache policy and past usage follow (they hold the team's id)."""
        return quotas.rename_team(name, data.name, actor)


CONTROLLERS = [UsageController, QuotaController, PriceController, TeamController]
