"""Admin API for usage reports, quotas, prices and teams.

Handlers are thin: they parse, call :class:`appliance.metering.admin.QuotaService`
or :func:`appliance.metering.reports.query_usage`, and shape the answer. They read
``request.app.state.db`` (engine), ``.meter`` (told about changes) and record the
caller in the audit log. The admin guard is added where the app is assembled.
Register ``CONTROLLERS``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post, put
from litestar.params import Parameter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from appliance.api.access import Access, audit_actor, requires
from appliance.errors import BadRequest
from appliance.metering.admin import QuotaService
from appliance.metering.reports import parse_by, parse_time, query_usage, to_csv

MAX_COUNT = 10**15
MAX_MONEY = 1e12


class _Numbers(BaseModel):
    """A body of numbers or nulls. Litestar validates pydantic models leniently (``true`` → 1,
    ``"5"`` → 5), so other JSON types are refused here, before any conversion."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_only(cls, data: Any) -> Any:
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


class PriceUpdate(_Numbers):
    """Rates per million tokens. Fields left out keep their value (zero for a new price)."""

    input_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)
    output_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)
    cached_per_m: float | None = Field(default=None, ge=0, le=MAX_MONEY)


class TeamCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _service(request: Request) -> QuotaService:
    state = request.app.state
    return QuotaService(state.db, getattr(state, "meter", None))


class UsageController(Controller):
    path = "/admin/usage"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def usage(
        self,
        request: Request,
        since: str | None = None,
        until: str | None = None,
        key: str | None = None,
        team: str | None = None,
        model: Annotated[str | None, Parameter(max_length=200)] = None,
        by: str | None = None,
        fmt: Annotated[str, Parameter(query="format", pattern="^(json|csv)$")] = "json",
    ) -> Response:
        """Usage totals between ``since`` and ``until`` (default: the last 30 days), grouped by key, team, model, day or hour."""
        now = time.time()
        service = _service(request)
        start, end = parse_time(since, now, param="since"), parse_time(until, now, param="until")
        if start is not None and end is not None and start >= end:
            raise BadRequest("since must be before until.", param="since")
        report = query_usage(
            request.app.state.db,
            since=start,
            until=end,
            key_id=service.resolve(f"key:{key}").id if key else None,
            team_id=service.resolve(f"team:{team}").id if team else None,
            model=model,
            by=parse_by(by),
            now=now,
        )
        if fmt == "csv":
            return Response(to_csv(report), media_type="text/csv",
                            headers={"content-disposition": 'attachment; filename="usage.csv"'})
        return Response(report)


class QuotaController(Controller):
    path = "/admin/quotas"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get("/{subject:str}", sync_to_thread=True)
    def show_quota(self, request: Request, subject: str) -> dict[str, Any]:
        """Limits of ``key:<id or prefix>`` or ``team:<name>`` and its counters in the current windows."""
        return _service(request).get_quota(subject)

    @put("/{subject:str}", sync_to_thread=True)
    def set_quota(self, request: Request, subject: str, data: QuotaUpdate) -> dict[str, Any]:
        """Set limits; null removes one, a field left out keeps its value."""
        changes = data.model_dump(include=data.model_fields_set)
        return _service(request).set_quota(subject, changes, audit_actor(request))

    @delete("/{subject:str}", sync_to_thread=True)
    def remove_quota(self, request: Request, subject: str) -> None:
        """Remove every limit of a key or team."""
        _service(request).delete_quota(subject, audit_actor(request))


class PriceController(Controller):
    path = "/admin/prices"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def list_prices(self, request: Request) -> list[dict[str, Any]]:
        """Every price row."""
        return _service(request).list_prices()

    @get("/{model:str}", sync_to_thread=True)
    def show_price(self, request: Request, model: str) -> dict[str, Any]:
        """Price of ``*``, a family, or ``family:variant``."""
        return _service(request).get_price(model)

    @put("/{model:str}", sync_to_thread=True)
    def set_price(self, request: Request, model: str, data: PriceUpdate) -> dict[str, Any]:
        """Set rates per million tokens (input, output, cached)."""
        changes = {k: v for k, v in data.model_dump(include=data.model_fields_set).items() if v is not None}
        return _service(request).set_price(model, changes, audit_actor(request))

    @delete("/{model:str}", sync_to_thread=True)
    def remove_price(self, request: Request, model: str) -> None:
        _service(request).delete_price(model, audit_actor(request))


class TeamController(Controller):
    path = "/admin/teams"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def list_teams(self, request: Request) -> list[dict[str, Any]]:
        """Teams with their number of live keys."""
        return _service(request).list_teams()

    @post(sync_to_thread=True)
    def create_team(self, request: Request, data: TeamCreate) -> dict[str, Any]:
        return _service(request).create_team(data.name, audit_actor(request))


CONTROLLERS = [UsageController, QuotaController, PriceController, TeamController]
