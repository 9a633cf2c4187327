"""Jobs in the console: start one under the signed-in user, stream its progress bar as SSE, cancel it,
and clear finished ones from the list.

The stream sends ``progress`` events (the rendered ``_job_body.html``) until the
job ends, then ``done`` (a snippet that refreshes the installed-models table).
The page closes the connection on ``done`` (``sse-close``); the server then
waits briefly so the browser closes first and EventSource does not reconnect.
Cancelling asks the job to stop (the registry's ``cancel``: the work checks for it
between chunks, a child process is terminated); the stream then shows it
``cancelled``, without a Cancel button from the moment the cancel was asked. The
answer to Cancel ("Cancelling the pull of X…") goes into the job card's own
feedback region (``#job-<id>-feedback``, a live region outside the parts the
stream replaces), so a progress update arriving before or just after the answer
cannot wipe it. Clearing forgets finished jobs from the live list only: their rows
in the ``jobs`` table stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import ServerSentEvent, ServerSentEventMessage

from appliance.db.audit import AuditTrail
from appliance.jsontypes import JsonObject
from appliance.serving.names import ModelNames
from appliance.store.jobs import Job, JobContext, JobRegistry, Work
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import partial, render

LINGER_S = 15.0
MODEL_JOBS = ("pull", "import", "verify", "quantize")
LISTED = 8


def submit(jobs: JobRegistry, names: ModelNames, kind: str, target: str, work: Work) -> Job:
    """Start ``work`` as a job; once it ends, whatever the outcome, remembered model names are forgotten."""

    def run(ctx: JobContext) -> JsonObject | None:
        try:
            return work(ctx)
        finally:
            names.forget()

    return jobs.submit(kind, target, run)


def console_jobs(jobs: JobRegistry) -> list[Job]:
    """The model jobs the models page lists, newest first."""
    return [j for j in jobs.list() if j.kind in MODEL_JOBS][:LISTED]


def jobs_fragment(request: Request, jobs: JobRegistry, message: str | None = None) -> Response:
    return partial(request, "_jobs.html", jobs=console_jobs(jobs), message=message)


def _progress(job: Job, can_cancel: bool) -> ServerSentEventMessage:
    """The card's body; no Cancel once a cancel was asked (the job may run on until its next check)."""
    may_cancel = can_cancel and not job.cancel_event.is_set()
    return ServerSentEventMessage(data=render("_job_body.html", job=job.view(), can_cancel=may_cancel), event="progress")


async def _events(jobs: JobRegistry, job: Job, can_cancel: bool) -> AsyncIterator[ServerSentEventMessage]:
    yield _progress(job, can_cancel)
    async for _event in jobs.follow(job.id, 0):
        yield _progress(job, can_cancel)
    yield ServerSentEventMessage(data=render("_job_done.html", job=job.view()), event="done")
    await asyncio.sleep(LINGER_S)


def job_handlers() -> list[HTTPRouteHandler]:
    @get("/jobs/{job_id:int}/events", include_in_schema=False)
    async def job_events(job_id: int, jobs: JobRegistry, user: ConsoleUser) -> ServerSentEvent:
        job = jobs.get(job_id)  # 404 before the stream starts
        return ServerSentEvent(
            _events(jobs, job, user.can("admin")), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    @post("/jobs/{job_id:int}/cancel", guards=[needs("admin")], include_in_schema=False)
    async def job_cancel(request: Request, job_id: int, jobs: JobRegistry, audit: AuditTrail, user: ConsoleUser) -> Response:
        job = jobs.get(job_id)
        was_running = not job.finished
        asked_before = job.cancel_event.is_set()  # a second click before the card lost its Cancel button
        jobs.cancel(job_id)
        if was_running and not asked_before:
            audit.record(user.actor, "job.cancel", job.target or job.kind, f"job={job.id} kind={job.kind}")
        message = (
            f"Cancelling the {job.kind} of {job.target}…" if was_running else f"The {job.kind} of {job.target} had already ended."
        )
        return partial(request, "_job_feedback.html", message=message)

    @post("/jobs/clear", guards=[needs("admin")], include_in_schema=False)
    async def jobs_clear(request: Request, jobs: JobRegistry) -> Response:
        cleared = jobs.clear_finished(MODEL_JOBS)
        return jobs_fragment(
            request,
            jobs,
            f"Cleared {cleared} finished job{'' if cleared == 1 else 's'} from the list."
            if cleared
            else "No finished jobs to clear.",
        )

    return [job_events, job_cancel, jobs_clear]
