"""Usage: tokens and cost by day, model, key and team, with totals and CSV export."""

from __future__ import annotations

import datetime as dt
import time

from litestar import Request, Response, get
from sqlalchemy.engine import Engine

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.forecast import budget_forecasts
from appliance.metering.reports import query_usage, to_csv
from appliance.webui.render import page

PERIODS = (1, 7, 30, 90)
GROUPS = ("day", "model", "key", "team")


def _days(request: Request) -> int:
    raw = request.query_params.get("days", "30")
    if not raw.isdigit() or int(raw) not in PERIODS:
        raise BadRequest(f"days must be one of {', '.join(map(str, PERIODS))}", param="days")
    return int(raw)


def _query(db: Engine, by: str, days: int, now: float) -> JsonObject:
    return query_usage(db, since=now - days * 86400, until=now + 1, by=(by,), now=now)


def _fill_days(rows: list[JsonObject], days: int, now: float) -> list[JsonObject]:
    by_day = {r["day"]: r for r in rows}
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    out = []
    for back in range(days - 1, -1, -1):
        day = (today - dt.timedelta(days=back)).isoformat()
        out.append(by_day.get(day) or {"day": day, "requests": 0, "total_tokens": 0, "prompt_tokens": 0,
                                       "completion_tokens": 0, "cached_tokens": 0, "cost": 0.0, "failed": 0})
    return out


def _label(by: str, row: JsonObject) -> str:
    if by == "key":
        return f"{row.get('key_name')} ({row.get('key')}…)" if row.get("key") else "console / local"
    if by == "team":
        return row.get("team") or "no team"
    return str(row.get(by) or "–")


@get("/usage", include_in_schema=False, sync_to_thread=True)
def usage_page(request: Request, db: Engine) -> Response:
    days = _days(request)
    now = time.time()
    daily = _query(db, "day", days, now)
    groups = {}
    for by in ("model", "key", "team"):
        report = _query(db, by, days, now)
        rows = sorted(report["rows"], key=lambda r: r["total_tokens"], reverse=True)
        top = max((r["total_tokens"] for r in rows), default=0)
        groups[by] = {"rows": [{**r, "label": _label(by, r)} for r in rows], "top": top}
    filled = _fill_days(daily["rows"], days, now)
    return page(request, "usage.html", active="usage", days=days, periods=PERIODS, totals=daily["totals"], daily=filled,
                day_bars=[(r["day"], r["total_tokens"]) for r in filled], cost_bars=[(r["day"], r["cost"]) for r in filled],
                groups=groups, forecasts=budget_forecasts(db, now))


@get("/usage.csv", include_in_schema=False, sync_to_thread=True)
def usage_csv(request: Request, db: Engine) -> Response:
    days = _days(request)
    by = request.query_params.get("by", "day")
    if by not in GROUPS:
        raise BadRequest(f"by must be one of {', '.join(GROUPS)}", param="by")
    report = _query(db, by, days, time.time())
    return Response(content=to_csv(report), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="usage-by-{by}-{days}d.csv"'})


HANDLERS = [usage_page, usage_csv]
