"""The request log under /admin/requests: every request answered, served, refused or failed, newest first.

Admin only (an admin key or the local admin socket); the console's Requests page reads the same log. Handlers
are thin: :mod:`appliance.requestlog.queries` filters and pages, the writer says what it dropped.
"""

from __future__ import annotations

import time
from typing import Annotated

from litestar import Controller, Response, get
from litestar.params import Parameter
from sqlalchemy.engine import Engine

from appliance.api.access import Access, requires
from appliance.jsontypes import JsonObject
from appliance.requestlog.queries import MAX_PAGE, PAGE, parse_filters, query_requests, row_json, to_csv
from appliance.requestlog.writer import RequestLog

_TEXT = Parameter(max_length=200)


class RequestsController(Controller):
    path = "/admin/requests"
    opt = requires(Access.ADMIN)
    tags = ["admin"]

    @get(sync_to_thread=True)
    def requests(
        self,
        db: Engine,
        request_log: RequestLog,
        status: Annotated[str | None, _TEXT] = None,
        key: Annotated[str | None, _TEXT] = None,
        model: Annotated[str | None, _TEXT] = None,
        endpoint: Annotated[str | None, _TEXT] = None,
        reason: Annotated[str | None, _TEXT] = None,
        since: Annotated[str | None, _TEXT] = None,
        until: Annotated[str | None, _TEXT] = None,
        request_id: Annotated[str | None, _TEXT] = None,
        cursor: Annotated[str | None, Parameter(max_length=20)] = None,
        limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = PAGE,
        fmt: Annotated[str, Parameter(query="format", pattern="^(json|csv)$")] = "json",
    ) -> Response:
        """Requests matching every filter given, newest first, ``limit`` a page; ``next_cursor`` asks for the next.

        ``status`` takes a code (``401``), a class (``4xx``) or ``served``, ``refused`` (4xx but 499), ``failed``
        (5xx and 499, the client left); ``key`` a key's prefix or id; ``model`` the name the request gave or the
        model that served it; ``endpoint`` a route as the log writes it (``/v1/chat/completions``); ``reason`` an
        error code (``invalid_api_key``); ``since``/``until`` epoch seconds, ISO 8601 or an age (``1h``);
        ``request_id`` an ``x-request-id``. ``dropped`` counts entries the log could not keep since the start."""
        filters = parse_filters(
            {
                "status": status or "",
                "key": key or "",
                "model": model or "",
                "endpoint": endpoint or "",
                "reason": reason or "",
                "since": since or "",
                "until": until or "",
                "request_id": request_id or "",
            }
        )
        page = query_requests(db, filters, cursor=cursor, limit=limit, now=time.time())
        if fmt == "csv":
            return Response(content=to_csv(page.rows), media_type="text/csv; charset=utf-8")
        body: JsonObject = {
            "object": "list",
            "data": [row_json(r) for r in page.rows],
            "has_more": page.next_cursor is not None,
            "next_cursor": page.next_cursor,
            "dropped": request_log.dropped,
        }
        return Response(content=body)
