"""Reading the request log: filters from query parameters, pages newest first, refusals by reason, CSV.

``/admin/requests``, the console's Requests page and its CSV export read the same parameters through
:func:`parse_filters`. The tokens and the canonical model of a request the gateway served come from its usage
row, joined by request id; a refused request has none.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime

from sqlalchemy import Engine, text

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.reports import csv_cell, parse_time
from appliance.requestlog.entry import MAX_TEXT

PAGE = 50
MAX_PAGE = 500
CSV_MAX_ROWS = 100_000
#: ``status=`` takes a code, a class, or one of these outcomes.
OUTCOMES = {
    "served": "r.status < 400",
    "refused": "r.status >= 400 AND r.status < 499",
    "failed": "(r.status = 499 OR r.status >= 500)",
}
_STATUS = re.compile(r"^[1-5](?:[0-9]{2}|xx)$")
PARAMS = ("status", "key", "model", "endpoint", "reason", "since", "until", "request_id")


@dataclass(frozen=True, slots=True)
class RequestFilters:
    """What a view of the log shows; empty fields select everything. ``key`` is as given (a prefix or an id)."""

    status: str = ""
    key: str = ""
    model: str = ""
    endpoint: str = ""
    reason: str = ""
    since: str = ""
    until: str = ""
    request_id: str = ""

    def query(self, **extra: str) -> dict[str, str]:
        """The parameters that are set (for links to this view), plus ``extra``."""
        return {k: v for k, v in {**{f.name: getattr(self, f.name) for f in fields(self)}, **extra}.items() if v}


def parse_filters(params: Mapping[str, str]) -> RequestFilters:
    """The filters of ``params``, checked: a status that is no code, class or outcome is a 400 naming it."""
    values = {name: (params.get(name) or "").strip()[:MAX_TEXT] for name in PARAMS}
    status = values["status"].lower()
    if status and status not in OUTCOMES and not _STATUS.match(status):
        raise BadRequest("status must be a code (401), a class (4xx) or one of served, refused, failed.", param="status")
    return RequestFilters(**{**values, "status": status})


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[JsonObject]
    next_cursor: str | None  # pass as ``cursor`` for the next (older) page


def _where(db: Engine, f: RequestFilters, now: float) -> tuple[list[str], dict[str, object]]:
    where: list[str] = []
    args: dict[str, object] = {}
    if f.status in OUTCOMES:
        where.append(OUTCOMES[f.status])
    elif f.status.endswith("xx"):
        low = int(f.status[0]) * 100
        where.append("r.status >= :low AND r.status < :high")
        args.update(low=low, high=low + 100)
    elif f.status:
        where.append("r.status = :status")
        args["status"] = int(f.status)
    if f.key:
        where.append("r.key_id = :key_id")
        args["key_id"] = key_id(db, f.key)
    if f.model:
        where.append("(r.model = :model OR u.model = :model)")
        args["model"] = f.model
    for name in ("endpoint", "reason", "request_id"):
        value = getattr(f, name)
        if value:
            where.append(f"r.{name} = :{name}")
            args[name] = value
    since = parse_time(f.since or None, now, param="since")
    until = parse_time(f.until or None, now, param="until")
    if since is not None:
        where.append("r.created_at >= :since")
        args["since"] = since
    if until is not None:
        where.append("r.created_at < :until")
        args["until"] = until
    return where, args


def key_id(db: Engine, key: str) -> int:
    """The id of the key a filter names by prefix or id; an unknown key is a 400."""
    by_id = key.isdigit() and len(key) < 19
    with db.connect() as conn:
        found = conn.execute(
            text("SELECT id FROM api_keys WHERE id = :k" if by_id else "SELECT id FROM api_keys WHERE prefix = :k"),
            {"k": int(key) if by_id else key},
        ).scalar()
    if found is None:
        raise BadRequest(f"There is no API key {key[:24]!r}.", param="key")
    return int(found)


_SELECT = (
    "SELECT r.id, r.created_at, r.request_id, r.key_id, k.prefix AS key_prefix, k.name AS key_name, r.user, r.address,"
    " r.method, r.endpoint, COALESCE(u.model, r.model) AS model, r.status, r.reason, r.latency_ms,"
    " u.prompt_tokens, u.completion_tokens, u.cache_tier"
    " FROM request_log r LEFT JOIN usage u ON u.request_id = r.request_id LEFT JOIN api_keys k ON k.id = r.key_id"
)


def _cursor(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or len(value) > 18:
        raise BadRequest("cursor must be the next_cursor of a previous page.", param="cursor")
    return int(value)


def query_requests(
    db: Engine, f: RequestFilters, *, cursor: str | None = None, limit: int = PAGE, now: float | None = None
) -> Page:
    """One page of matching requests, newest first, and the cursor of the next page (None on the last)."""
    where, args = _where(db, f, time.time() if now is None else now)
    before = _cursor(cursor)
    if before is not None:
        where.append("r.id < :before")
        args["before"] = before
    limit = max(1, min(limit, CSV_MAX_ROWS))
    sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id DESC LIMIT :limit"
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(sql), {**args, "limit": limit + 1})]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows=rows, next_cursor=str(rows[-1]["id"]) if more and rows else None)


def refusals(
    db: Engine, *, since: float, until: float, key_id: int | None = None, team_id: int | None = None
) -> list[JsonObject]:
    """Requests refused or failed in ``[since, until)``, counted by status and reason, most frequent first."""
    where = ["created_at >= :since", "created_at < :until", "status >= 400"]
    args: dict[str, object] = {"since": since, "until": until}
    if key_id is not None:
        where.append("key_id = :key_id")
        args["key_id"] = key_id
    if team_id is not None:
        where.append("key_id IN (SELECT id FROM api_keys WHERE team_id = :team_id)")
        args["team_id"] = team_id
    sql = (
        "SELECT status, reason, count(*) AS requests FROM request_log WHERE "
        + " AND ".join(where)
        + " GROUP BY status, reason ORDER BY requests DESC, status LIMIT 50"
    )
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), args)]


CSV_COLUMNS = (
    "time",
    "request_id",
    "key",
    "user",
    "address",
    "method",
    "endpoint",
    "model",
    "status",
    "reason",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_csv(rows: list[JsonObject]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        cells = (
            iso(r["created_at"]),
            r["request_id"],
            r["key_prefix"],
            r["user"],
            r["address"],
            r["method"],
            r["endpoint"],
            r["model"],
            r["status"],
            r["reason"],
            f"{r['latency_ms']:.1f}",
            r["prompt_tokens"],
            r["completion_tokens"],
        )
        writer.writerow([csv_cell(c) if isinstance(c, str) or c is None else c for c in cells])
    return out.getvalue()


def row_json(r: JsonObject) -> JsonObject:
    """A row as ``/admin/requests`` answers it."""
    return {
        "request_id": r["request_id"],
        "created_at": r["created_at"],
        "time": iso(r["created_at"]),
        "key": r["key_prefix"],
        "key_name": r["key_name"],
        "user": r["user"],
        "address": r["address"],
        "method": r["method"],
        "endpoint": r["endpoint"],
        "model": r["model"],
        "status": r["status"],
        "reason": r["reason"],
        "latency_ms": r["latency_ms"],
        "prompt_tokens": r["prompt_tokens"],
        "completion_tokens": r["completion_tokens"],
        "cache": r["cache_tier"],
    }
