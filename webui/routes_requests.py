"""Requests: the request log, filtered, searched by request id, paged, and exported as CSV (operators and admins).

The filters live in the URL (``status``, ``key``, ``model``, ``endpoint``, ``reason``, ``since``, ``until``,
``request_id``, and ``cursor`` for older pages), so Usage, the audit log and the alerts link to a view of it. They
are read by :func:`appliance.requestlog.queries.parse_filters`, as ``/admin/requests`` reads them.
"""

from __future__ import annotations

import time
from urllib.parse import urlencode

from litestar import Request, Response, get
from sqlalchemy.engine import Engine

from appliance.requestlog.queries import CSV_MAX_ROWS, OUTCOMES, PAGE, parse_filters, query_requests, to_csv
from appliance.requestlog.writer import RequestLog
from appliance.settings import Settings
from appliance.webui.gate import needs
from appliance.webui.render import page


@get("/requests", guards=[needs("operator")], include_in_schema=False, sync_to_thread=True)
def requests_page(request: Request, db: Engine, request_log: RequestLog, settings: Settings) -> Response:
    filters = parse_filters(request.query_params)
    cursor = request.query_params.get("cursor") or None
    found = query_requests(db, filters, cursor=cursor, limit=PAGE, now=time.time())
    return page(
        request,
        "requests.html",
        active="requests",
        rows=found.rows,
        filters=filters,
        outcomes=list(OUTCOMES),
        query=urlencode(filters.query()),
        older=urlencode(filters.query(cursor=found.next_cursor)) if found.next_cursor else None,
        paged=cursor is not None,
        dropped=request_log.dropped,
        days=settings.request_log_days,
        max_rows=settings.request_log_max_rows,
    )


@get("/requests.csv", guards=[needs("operator")], include_in_schema=False, sync_to_thread=True)
def requests_csv(request: Request, db: Engine) -> Response:
    """Every matching request (up to 100,000, newest first) as CSV."""
    filters = parse_filters(request.query_params)
    found = query_requests(db, filters, limit=CSV_MAX_ROWS, now=time.time())
    return Response(
        content=to_csv(found.rows),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="requests.csv"'},
    )


HANDLERS = [requests_page, requests_csv]
