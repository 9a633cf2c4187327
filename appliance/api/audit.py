"""Admin API: the audit log, filtered and paged (``GET /admin/audit``), or exported as CSV with the same filters
(``format=csv``, streamed a batch of rows at a time). Admin only (``appliance.api.access``).

The console's Audit log page and its export read through the same helpers (:func:`audit_filter`,
:func:`csv_response`).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated

from litestar import Controller, Response, get
from litestar.params import Parameter
from litestar.response import Stream
from sqlalchemy.engine import Engine

from appliance.api.access import Access, requires
from appliance.batch.objects import list_page
from appliance.db.audit import AuditFilter, iter_rows, read_page
from appliance.db.tables import AuditLog
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.reports import csv_cell, parse_time
from appliance.metering.usage_filters import parse_to

PAGE = 100
MAX_PAGE = 500
TEXT_LIMIT = 128
CSV_COLUMNS = ("id", "time", "actor", "action", "target", "detail")


def audit_filter(
    now: float,
    *,
    start: str | None = None,
    to: str | None = None,
    actor: str | None = None,
    action: str | None = None,
    text: str | None = None,
) -> AuditFilter:
    """Filters from request parameters: ``from`` and ``to`` as epoch seconds, ISO 8601 or an age such as ``7d`` (a
    bare date as ``to`` includes that day); empty values filter nothing."""
    since = parse_time(start or None, now, param="from")
    until = parse_to(to or None, now, param="to")
    if since is not None and until is not None and since >= until:
        raise BadRequest("from must be before to.", param="from")
    for name, value in (("actor", actor), ("action", action), ("q", text)):
        if value and len(value) > TEXT_LIMIT:
            raise BadRequest(f"{name} is longer than {TEXT_LIMIT} characters.", param=name)
    return AuditFilter(since, until, (actor or "").strip() or None, (action or "").strip() or None, (text or "").strip() or None)


def audit_row(row: AuditLog) -> JsonObject:
    return {
        "id": row.id,
        "created_at": row.created_at,
        "actor": row.actor,
        "action": row.action,
        "target": row.target,
        "detail": row.detail,
    }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def csv_lines(db: Engine, filters: AuditFilter) -> Iterator[str]:
    """The matching rows as CSV, newest first, a line at a time; text cells guarded against spreadsheet formulas."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in iter_rows(db, filters):
        writer.writerow([row.id, _iso(row.created_at), *(csv_cell(v) for v in (row.actor, row.action, row.target, row.detail))])
        if out.tell() >= 64 * 1024:
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()


def csv_response(db: Engine, filters: AuditFilter, now: float) -> Stream:
    """The export as a streamed download (read from the database off the event loop, a batch at a time)."""
    name = f"audit-{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%SZ}.csv"
    return Stream(
        csv_lines(db, filters),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{name}"', "cache-control": "no-store"},
    )


class AuditController(Controller):
    path = "/admin/audit"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def audit_log(
        self,
        db: Engine,
        start: Annotated[str | None, Parameter(query="from", max_length=64)] = None,
        to: Annotated[str | None, Parameter(max_length=64)] = None,
        who: Annotated[str | None, Parameter(query="actor")] = None,  # `actor` is the caller's own name (a dependency)
        action: str | None = None,
        q: str | None = None,
        after: Annotated[int | None, Parameter(ge=0)] = None,
        limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = PAGE,
        fmt: Annotated[str, Parameter(query="format", pattern="^(json|csv)$")] = "json",
    ) -> Response | Stream:
        """Audit rows, newest first, filtered by ``from``/``to`` (epoch seconds, ISO 8601 or an age like ``7d``),
        ``actor`` (exact), ``action`` (exact, or a group: ``key`` matches ``key.create``) and ``q`` (text in any
        column). A page holds ``limit`` rows; the next one is ``after=<last_id>`` while ``has_more``.
        ``format=csv`` streams every matching row (no paging) as a download."""
        now = time.time()
        filters = audit_filter(now, start=start, to=to, actor=who, action=action, text=q)
        if fmt == "csv":
            return csv_response(db, filters, now)
        page = read_page(db, filters, after=after, limit=limit)
        return Response(list_page([audit_row(r) for r in page.rows], page.has_more))


CONTROLLERS = [AuditController]
