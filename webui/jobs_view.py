"""Jobs in the console: start one under the signed-in user, stream its progress bar as SSE.

The stream sends ``progress`` events (the rendered ``_job_body.html``) until the
job ends, then ``done`` (a snippet that refreshes the installed-models table).
The page closes the connection on ``done`` (``sse-close``); the server then
waits briefly so the browser closes first and EventSource does not reconnect.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from litestar import get
from litestar.handlers import HTTPRouteHandler
from litestar.response import ServerSentEvent, ServerSentEventMessage

from appliance.jsontypes import JsonObject
from appliance.serving.names import ModelNames
from appliance.store.jobs import Job, JobContext, JobRegistry, Work
from appliance.webui.render import render

LINGER_S = 15.0


def submit(jobs: JobRegistry, names: ModelNames, kind: str, target: str, work: Work) -> Job:
    """Start ``work`` as a job; once it ends, whatever the outcome, remembered model names are forgotten."""

    def run(ctx: JobContext) -> JsonObject | None:
        try:
            return work(ctx)
        finally:
            names.forget()

    return jobs.submit(kind, target, run)


async def _events(jobs: JobRegistry, job: Job) -> AsyncIterator[ServerSentEventMessage]:
    yield ServerSentEventMessage(data=render("_job_body.html", job=job.view()), event="progress")
    async for _event in jobs.follow(job.id, 0):
        yield ServerSentEventMessage(data=render("_job_body.html", job=job.view()), event="progress")
    yield ServerSentEventMessage(data=render("_job_done.html", job=job.view()), event="done")
    await asyncio.sleep(LINGER_S)


def job_handlers() -> list[HTTPRouteHandler]:
    @get("/jobs/{job_id:int}/events", include_in_schema=False)
    async def job_events(job_id: int, jobs: JobRegistry) -> ServerSentEvent:
        job = jobs.get(job_id)  # 404 before the stream starts
        return ServerSentEvent(_events(jobs, job), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return [job_events]
