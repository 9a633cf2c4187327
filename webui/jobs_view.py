"""Jobs in the console: start one under the signed-in user, stream its progress bar as SSE.

The stream sends ``progress`` events (the rendered ``_job_body.html``) until the
job ends, then ``done`` (a snippet that refreshes the installed-models table).
The page closes the connection on ``done`` (``sse-close``); the server then
waits briefly so the browser closes first and EventSource does not reconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

from litestar import Request, get
from litestar.response import ServerSentEvent, ServerSentEventMessage

from appliance.errors import EngineUnavailable
from appliance.webui.context import services
from appliance.webui.render import render

LINGER_S = 15.0


def _jobs(request: Request) -> Any:
    jobs = getattr(services(request), "jobs", None)
    if jobs is None:
        raise EngineUnavailable("The job registry is not available.")
    return jobs


def submit(request: Request, kind: str, target: str, work: Callable[[Any], Any]) -> Any:
    svc = services(request)

    def run(ctx: Any) -> dict[str, Any] | None:
        try:
            info = work(ctx)
        finally:
            svc.names_changed()
        return info.to_dict() if hasattr(info, "to_dict") else None

    return _jobs(request).submit(kind, target, run)


async def _events(request: Request, job_id: int) -> AsyncIterator[ServerSentEventMessage]:
    jobs = _jobs(request)
    job = jobs.get(job_id)
    yield ServerSentEventMessage(data=render("_job_body.html", job=job.view()), event="progress")
    async for _event in jobs.follow(job.id, 0):
        yield ServerSentEventMessage(data=render("_job_body.html", job=job.view()), event="progress")
    yield ServerSentEventMessage(data=render("_job_done.html", job=job.view()), event="done")
    await asyncio.sleep(LINGER_S)


def job_handlers() -> list[Any]:
    @get("/jobs/{job_id:int}/events", include_in_schema=False)
    async def job_events(request: Request, job_id: int) -> ServerSentEvent:
        _jobs(request).get(job_id)  # 404 before the stream starts
        return ServerSentEvent(_events(request, job_id), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return [job_events]
