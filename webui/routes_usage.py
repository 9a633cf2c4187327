"""Usage: tokens, cost, requests, latency and cache savings over time, filtered by team, key, model and range.

The filters live in the URL (``range``, ``from``, ``to``, ``team``, ``key``, ``model``),
so a view can be shared and the back button restores it; the filter form applies
them through htmx and swaps only the report. The page, its CSV export and
``/admin/usage`` read the same parameters through
:func:`appliance.metering.usage_filters.resolve_filters` and their figures from
:func:`appliance.metering.reports.query_usage`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from litestar import Request, Response, get
from sqlalchemy.engine import Engine

from appliance.accounts.labels import key_label
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.economics import OwnerRates, box_totals, report_owner_cost
from appliance.metering.forecast import budget_forecasts
from appliance.metering.reports import query_usage, to_csv
from appliance.metering.series import DAY, Bucket, bucket_for, bucket_label, bucket_starts
from appliance.metering.usage_filters import RANGES, UsageFilters, custom_range, filter_choices, preset_range, resolve_filters
from appliance.requestlog.queries import refusals
from appliance.settings import Settings
from appliance.webui.chart_axes import TimeAxis
from appliance.webui.gate import is_htmx
from appliance.webui.money import money
from appliance.webui.render import page, partial

DEFAULT_RANGE = "30d"
MAX_CHART_DAYS = 1000
CSV_GROUPS = ("hour", "day", "model", "key", "team")
RANGE_NAMES = {
    "24h": "Last 24 hours",
    "today": "Today",
    "7d": "Last 7 days",
    "30d": "Last 30 days",
    "month": "This month",
    "custom": "Custom",
}


@dataclass(frozen=True, slots=True)
class UsageView:
    """The filters as the URL gave them, and what they resolved to."""

    range: str
    start: str  # from, as a date for the form
    end: str  # to, as a date for the form (inclusive)
    team: str
    key: str
    model: str
    filters: UsageFilters
    bucket: Bucket

    def query(self, **extra: str) -> str:
        """The query string of this view (only the filters set), plus ``extra``."""
        fields = {
            "range": self.range,
            "from": self.start if self.range == "custom" else "",
            "to": self.end if self.range == "custom" else "",
            "team": self.team,
            "key": self.key,
            "model": self.model,
            **extra,
        }
        return urlencode({k: v for k, v in fields.items() if v})


def _date(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def usage_view(request: Request, db: Engine, now: float) -> UsageView:
    params = request.query_params
    start, end = params.get("from") or "", params.get("to") or ""
    chosen = params.get("range") or ("custom" if start or end else DEFAULT_RANGE)
    if chosen not in RANGES:
        raise BadRequest(f"range must be one of {', '.join(RANGES)}.", param="range")
    if chosen == "custom":
        since, until = custom_range(start or None, end or None, now)
    else:
        since, until = preset_range(chosen, now)
    if until - since > MAX_CHART_DAYS * DAY:
        raise BadRequest(
            f"from is more than {MAX_CHART_DAYS} days before to: the console charts at most that many days at once;"
            " /admin/usage reports any range.",
            param="from",
        )
    filters = resolve_filters(
        db, since=since, until=until, team=params.get("team"), key=params.get("key"), model=params.get("model")
    )
    return UsageView(
        range=chosen,
        start=_date(since),
        end=_date(until - 1),
        team=params.get("team") or "",
        key=params.get("key") or "",
        model=params.get("model") or "",
        filters=filters,
        bucket=bucket_for(since, until),
    )


def _report(db: Engine, view: UsageView, by: tuple[str, ...], now: float) -> JsonObject:
    f = view.filters
    return query_usage(db, since=f.since, until=f.until, key_id=f.key_id, team_id=f.team_id, model=f.model, by=by, now=now)


@dataclass(frozen=True, slots=True)
class Series:
    """A report by hour or day laid out for the charts: every bucket of the range, empty ones included, oldest first."""

    axis: TimeAxis
    rows: list[JsonObject]

    def measure(self, name: str, empty: float | None = 0) -> list[float | None]:
        """One measure per bucket; ``empty`` where a bucket has no requests (None leaves a gap in a line)."""
        return [row.get(name, empty) for row in self.rows]


def _series(report: JsonObject, view: UsageView) -> Series:
    by_label = {r[view.bucket]: r for r in report["rows"]}
    starts = bucket_starts(view.filters.since, view.filters.until, view.bucket)
    rows = [by_label.get(bucket_label(t, view.bucket)) or {} for t in starts]
    return Series(axis=TimeAxis(starts=tuple(starts), bucket=view.bucket), rows=rows)


def _refusals(db: Engine, view: UsageView) -> JsonObject:
    """Requests the request log holds as refused or failed in the view's range (and key or team), by status and reason,
    and the query string of the view's range and key on the Requests page."""
    f = view.filters
    rows = refusals(db, since=f.since, until=f.until, key_id=f.key_id, team_id=f.team_id)
    query = urlencode({k: v for k, v in {"since": f"{f.since:.0f}", "until": f"{f.until:.0f}", "key": view.key}.items() if v})
    return {
        "rows": rows,
        "refused": sum(r["requests"] for r in rows if r["status"] < 499),
        "failed": sum(r["requests"] for r in rows if r["status"] >= 499),
        "query": query,
    }


def _label(by: str, row: JsonObject) -> str:
    if by == "key":
        return key_label(row.get("key_name"), row.get("key"), row.get("key_id")) if row.get("key_id") else "console / local"
    if by == "team":
        return row.get("team") or "no team"
    return str(row.get(by) or "–")


@get("/usage", include_in_schema=False, sync_to_thread=True)
def usage_page(request: Request, db: Engine, settings: Settings) -> Response:
    now = time.time()
    view = usage_view(request, db, now)
    over_time = _report(db, view, (view.bucket,), now)
    groups = {}
    for by in ("model", "key", "team"):
        rows = sorted(_report(db, view, (by,), now)["rows"], key=lambda r: r["total_tokens"], reverse=True)
        groups[by] = {
            "rows": [{**r, "label": _label(by, r)} for r in rows],
            "top": max((r["total_tokens"] for r in rows), default=0),
        }
    context = dict(
        view=view,
        ranges=RANGE_NAMES,
        choices=filter_choices(db),
        totals=over_time["totals"],
        series=_series(over_time, view),
        groups=groups,
        refusals=_refusals(db, view),
        currency=settings.currency,
    )
    if is_htmx(request) and request.headers.get("hx-history-restore-request") != "true":
        # the filter form swapped the report: the address bar shows the view, so it can be shared and gone back to
        return partial(request, "_usage_report.html", headers={"HX-Push-Url": f"/usage?{view.query()}"}, **context)
    return page(request, "usage.html", active="usage", forecasts=budget_forecasts(db, now), money=money, **context)


@get("/usage.csv", include_in_schema=False, sync_to_thread=True)
def usage_csv(request: Request, db: Engine, settings: Settings) -> Response:
    now = time.time()
    view = usage_view(request, db, now)
    by = request.query_params.get("by") or view.bucket
    if by not in CSV_GROUPS:
        raise BadRequest(f"by must be one of {', '.join(CSV_GROUPS)}", param="by")
    report = _report(db, view, (by,), now)
    rates = OwnerRates.of(settings)
    if rates.known:
        report = report_owner_cost(report, rates, box_totals(db, report["since"], report["until"]), now)
    name = f"usage-by-{by}-{view.start}-to-{view.end}.csv"
    return Response(
        content=to_csv(report),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


HANDLERS = [usage_page, usage_csv]
