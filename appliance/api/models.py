"""Admin API of the model store and its jobs: ``/admin/models`` and ``/admin/jobs``.

Long work (pull, import, verify, quantize) is checked synchronously first, so a
bad name, an unsafe path or a refused host answers 4xx at once, then runs as a
job: the answer is ``202`` with the job, whose progress streams as SSE from
``/admin/jobs/{id}/events`` (the console's progress bar, the CLI's too).

Every change is audited and drops remembered name resolutions
(:class:`StoreChanges`). Admin only (``appliance.api.access``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.di import Provide
from litestar.response import ServerSentEvent, ServerSentEventMessage, Stream

from appliance.api.access import Access, requires
from appliance.db.audit import AuditTrail
from appliance.jsontypes import JsonObject
from appliance.planner.service import available_fits
from appliance.planner.types import PlanRow
from appliance.serving.names import ModelNames
from appliance.store.bundles import bundle_stream
from appliance.store.jobs import Job, JobContext, JobRegistry
from appliance.store.refusals import check_downloaded
from appliance.store.store import ModelStore, VariantInfo

# Facts fields too large or too sensitive for list views (the template is untrusted text).
_HEAVY_FACTS = ("chat_template",)


class PullRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str | None = None  # a GGUF file's URL, or a hub spec hf:ORG/REPO[:QUANT|/FILE][@REVISION]
    sha256: str | None = None
    name: str | None = None


class ImportRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    name: str | None = None


class QuantizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    to: str


def _view(info: VariantInfo, *, full: bool = False) -> JsonObject:
    out = info.to_dict()
    facts = dict(out["facts"])
    if not full:
        for key in _HEAVY_FACTS:
            facts.pop(key, None)
    facts["has_chat_template"] = bool(info.facts.get("chat_template"))
    out["facts"] = facts
    return out


def _fit_view(row: PlanRow | None) -> JsonObject | None:
    if row is None:
        return None
    return {
        "fits": row.fits,
        "backend": row.backend,
        "placement": row.placement,
        "reason": row.reason,
        "estimated_bytes": row.estimated_bytes,
    }


@dataclass(frozen=True)
class StoreChanges:
    """What follows a change to the store: an audit row, and name resolutions forgotten."""

    names: ModelNames
    audit: AuditTrail
    jobs: JobRegistry
    actor: str

    def record(self, action: str, target: str | None, detail: str | None = None) -> None:
        self.names.forget()
        self.audit.record(self.actor, action, target, detail)

    def start(self, kind: str, target: str, work: Callable[[JobContext], VariantInfo | None]) -> JsonObject:
        """Run ``work`` as a job; the answer is the job's view (progress at /admin/jobs/{id}/events)."""

        def run(ctx: JobContext) -> JsonObject | None:
            try:
                info = work(ctx)
            finally:
                self.names.forget()
            return _view(info) if info is not None else None

        job = self.jobs.submit(kind, target, run)
        self.record(f"model.{kind}", target, f"job={job.id}")
        return job.view()


def provide_changes(names: ModelNames, audit: AuditTrail, jobs: JobRegistry, actor: str) -> StoreChanges:
    return StoreChanges(names, audit, jobs, actor)


CHANGES = {"changes": Provide(provide_changes, sync_to_thread=False)}


class ModelsController(Controller):
    path = "/admin/models"
    opt = requires(Access.ADMIN)
    tags = ["admin: models"]
    dependencies = CHANGES

    @get("/", sync_to_thread=True)
    def list_models(self, store: ModelStore) -> list[JsonObject]:
        """Every variant; an ``available`` one (listed on the hub, not downloaded) with the planner's ``fit``."""
        infos = store.list()
        fits = available_fits(store.settings, store.db, infos)
        return [{**_view(i), "fit": _fit_view(fits.get(i.name))} if i.available else _view(i) for i in infos]

    @post("/pull", status_code=202, sync_to_thread=True)
    def pull(self, store: ModelStore, changes: StoreChanges, data: PullRequest) -> JsonObject:
        hub = store.prepare_requested_pull(data.url, data.name, sha256=data.sha256)  # a hub spec, or an available variant
        if hub is not None:
            return {**changes.start("pull", hub.name, lambda ctx: store.pull_hub(hub, ctx=ctx)), "hub": hub.to_dict()}
        url, sha256, family, variant = store.prepare_pull(data.url, sha256=data.sha256, name=data.name)
        name = f"{family}:{variant}"
        return changes.start("pull", name, lambda ctx: store.pull(url, sha256=sha256, name=name, ctx=ctx))

    @post("/import", status_code=202, sync_to_thread=True)
    def import_model(self, store: ModelStore, changes: StoreChanges, data: ImportRequest) -> JsonObject:
        _source, _fmt, family, variant = store.prepare_import(data.path, data.name)
        name = f"{family}:{variant}"
        return changes.start("import", name, lambda ctx: store.import_path(data.path, name=name, ctx=ctx))

    @post("/scan", status_code=202, sync_to_thread=True)
    def scan(self, store: ModelStore, changes: StoreChanges) -> JsonObject:
        """Read-only store: register the models now in its folder, forget those gone (a job)."""
        store.check_scannable()

        def work(ctx: JobContext) -> JsonObject:
            try:
                return {"registered": [i.name for i in store.register_found(ctx=ctx)]}
            finally:
                changes.names.forget()

        job = changes.jobs.submit("scan", None, work)
        changes.record("model.scan", None, f"job={job.id}")
        return job.view()

    @get("/{name:str}", sync_to_thread=True)
    def inspect(self, store: ModelStore, name: str) -> JsonObject:
        info = store.get(name)
        out = _view(info, full=True)
        entry = store.catalog.variant(info.family, info.variant)
        out["catalog"] = entry.model_dump(mode="json") if entry is not None else None
        return out

    @get("/{name:str}/bundle", sync_to_thread=True)
    def export_bundle(self, store: ModelStore, changes: StoreChanges, name: str) -> Stream:
        """An offline bundle of the variant: a tar of ``manifest.json`` (sizes, sha256, facts) and its files."""
        manifest, files = store.export_bundle(name)
        changes.record("model.export", manifest["name"])
        filename = f"{manifest['family']}-{manifest['variant']}.tar"
        return Stream(
            bundle_stream(manifest, files),
            media_type="application/x-tar",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )

    @delete("/{name:str}", status_code=200, sync_to_thread=True)
    def delete_model(self, store: ModelStore, changes: StoreChanges, name: str) -> JsonObject:
        store.delete(name)
        changes.record("model.delete", name)
        return {"name": name, "deleted": True}

    @post("/{name:str}/verify", status_code=202, sync_to_thread=True)
    def verify(self, store: ModelStore, changes: StoreChanges, name: str) -> JsonObject:
        info = store.get(name)
        check_downloaded(info)
        return changes.start("verify", info.name, lambda ctx: store.verify(info.name, ctx=ctx))

    @post("/{name:str}/quantize", status_code=202, sync_to_thread=True)
    def quantize(self, store: ModelStore, changes: StoreChanges, name: str, data: QuantizeRequest) -> JsonObject:
        source, target = store.prepare_quantize(name, data.to)
        return changes.start("quantize", f"{source.family}:{target}", lambda ctx: store.quantize(source.name, target, ctx=ctx))

    @post("/{name:str}/default", status_code=200, sync_to_thread=True)
    def set_default(self, store: ModelStore, changes: StoreChanges, name: str) -> JsonObject:
        info = store.set_default(name)
        changes.record("model.default", info.name)
        return _view(info)


class JobsController(Controller):
    path = "/admin/jobs"
    opt = requires(Access.ADMIN)
    tags = ["admin: jobs"]
    dependencies = CHANGES

    @get("/")
    async def list_jobs(self, jobs: JobRegistry) -> list[JsonObject]:
        return [j.view() for j in jobs.list()]

    @get("/{job_id:int}")
    async def get_job(self, jobs: JobRegistry, job_id: int) -> JsonObject:
        return jobs.get(job_id).view()

    @get("/{job_id:int}/events")
    async def job_events(self, request: Request, jobs: JobRegistry, job_id: int, after: int = 0) -> ServerSentEvent:
        """Progress as Server-Sent Events until the job ends; resumes after ``Last-Event-ID``."""
        job: Job = jobs.get(job_id)
        last = request.headers.get("last-event-id", "")
        start = int(last) if last.isdigit() else after

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            async for event in jobs.follow(job.id, start):
                yield ServerSentEventMessage(data=json.dumps(event), event=event["type"], id=event["seq"])

        return ServerSentEvent(stream())

    @post("/{job_id:int}/cancel", status_code=200)
    async def cancel_job(self, jobs: JobRegistry, changes: StoreChanges, job_id: int) -> JsonObject:
        job = jobs.cancel(job_id)
        changes.record("job.cancel", job.target, f"job={job.id}")
        return job.view()
