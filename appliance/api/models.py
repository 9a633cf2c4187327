"""Admin API of the model store and its jobs: ``/admin/models`` and ``/admin/jobs``.

Long work (pull, import, verify, quantize) is checked synchronously first, so a
bad name, an unsafe path or a refused host answers 4xx at once, then runs as a
job: the answer is ``202`` with the job, whose progress streams as SSE from
``/admin/jobs/{id}/events`` (the console's progress bar, the CLI's too).

Uses ``app.state.store`` (ModelStore) and ``app.state.jobs`` (JobRegistry); with
``app.state.services`` present, actions are audited and cached name
resolutions are dropped when the store changes. The admin guard is applied in
front of these routes by the app.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.response import ServerSentEvent, ServerSentEventMessage

from appliance.store.jobs import Job, JobContext, JobRegistry
from appliance.store.store import ModelStore, VariantInfo
from appliance.api.access import Access, audit_actor, requires

# Facts fields too large or too sensitive for list views (the template is untrusted text).
_HEAVY_FACTS = ("chat_template",)


class PullRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str | None = None
    sha256: str | None = None
    name: str | None = None


class ImportRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    name: str | None = None


class QuantizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    to: str


def _view(info: VariantInfo, *, full: bool = False) -> dict[str, Any]:
    out = info.to_dict()
    facts = dict(out["facts"])
    if not full:
        for key in _HEAVY_FACTS:
            facts.pop(key, None)
    facts["has_chat_template"] = bool(info.facts.get("chat_template"))
    out["facts"] = facts
    return out


def _changed(request: Request, action: str, target: str | None, detail: str | None = None) -> None:
    services = getattr(request.app.state, "services", None)
    if services is None:
        return
    services.names_changed()
    services.audit(audit_actor(request), action, target, detail)


def _start(request: Request, kind: str, target: str, work: Callable[[JobContext], VariantInfo | None]) -> dict[str, Any]:
    jobs: JobRegistry = request.app.state.jobs
    services = getattr(request.app.state, "services", None)

    def run(ctx: JobContext) -> dict[str, Any] | None:
        try:
            info = work(ctx)
        finally:
            if services is not None:
                services.names_changed()
        return _view(info) if info is not None else None

    job = jobs.submit(kind, target, run)
    _changed(request, f"model.{kind}", target, f"job={job.id}")
    return job.view()


class ModelsController(Controller):
    path = "/admin/models"
    opt = requires(Access.ADMIN)
    tags = ["admin: models"]

    @get("/", sync_to_thread=True)
    def list_models(self, request: Request) -> list[dict[str, Any]]:
        store: ModelStore = request.app.state.store
        return [_view(i) for i in store.list()]

    @post("/pull", status_code=202, sync_to_thread=True)
    def pull(self, request: Request, data: PullRequest) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        url, sha256, family, variant = store.prepare_pull(data.url, sha256=data.sha256, name=data.name)
        name = f"{family}:{variant}"
        return _start(request, "pull", name, lambda ctx: store.pull(url, sha256=sha256, name=name, ctx=ctx))

    @post("/import", status_code=202, sync_to_thread=True)
    def import_model(self, request: Request, data: ImportRequest) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        _source, _fmt, family, variant = store.prepare_import(data.path, data.name)
        name = f"{family}:{variant}"
        return _start(request, "import", name, lambda ctx: store.import_path(data.path, name=name, ctx=ctx))

    @get("/{name:str}", sync_to_thread=True)
    def inspect(self, request: Request, name: str) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        info = store.get(name)
        out = _view(info, full=True)
        entry = store.catalog.variant(info.family, info.variant)
        out["catalog"] = entry.model_dump(mode="json") if entry is not None else None
        return out

    @delete("/{name:str}", status_code=200, sync_to_thread=True)
    def delete_model(self, request: Request, name: str) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        store.delete(name)
        _changed(request, "model.delete", name)
        return {"name": name, "deleted": True}

    @post("/{name:str}/verify", status_code=202, sync_to_thread=True)
    def verify(self, request: Request, name: str) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        info = store.get(name)
        return _start(request, "verify", info.name, lambda ctx: store.verify(info.name, ctx=ctx))

    @post("/{name:str}/quantize", status_code=202, sync_to_thread=True)
    def quantize(self, request: Request, name: str, data: QuantizeRequest) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        source, target = store.prepare_quantize(name, data.to)
        return _start(request, "quantize", f"{source.family}:{target}",
                      lambda ctx: store.quantize(source.name, target, ctx=ctx))

    @post("/{name:str}/default", status_code=200, sync_to_thread=True)
    def set_default(self, request: Request, name: str) -> dict[str, Any]:
        store: ModelStore = request.app.state.store
        info = store.set_default(name)
        _changed(request, "model.default", info.name)
        return _view(info)


class JobsController(Controller):
    path = "/admin/jobs"
    opt = requires(Access.ADMIN)
    tags = ["admin: jobs"]

    @get("/")
    async def list_jobs(self, request: Request) -> list[dict[str, Any]]:
        return [j.view() for j in request.app.state.jobs.list()]

    @get("/{job_id:int}")
    async def get_job(self, request: Request, job_id: int) -> dict[str, Any]:
        return request.app.state.jobs.get(job_id).view()

    @get("/{job_id:int}/events")
    async def job_events(self, request: Request, job_id: int, after: int = 0) -> ServerSentEvent:
        """Progress as Server-Sent Events until the job ends; resumes after ``Last-Event-ID``."""
        jobs: JobRegistry = request.app.state.jobs
        job: Job = jobs.get(job_id)
        last = request.headers.get("last-event-id", "")
        start = int(last) if last.isdigit() else after

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            async for event in jobs.follow(job.id, start):
                yield ServerSentEventMessage(data=json.dumps(event), event=event["type"], id=event["seq"])

        return ServerSentEvent(stream())

    @post("/{job_id:int}/cancel", status_code=200)
    async def cancel_job(self, request: Request, job_id: int) -> dict[str, Any]:
        job = request.app.state.jobs.cancel(job_id)
        _changed(request, "job.cancel", job.target, f"job={job.id}")
        return job.view()
