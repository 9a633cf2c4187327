"""Models: installed variants (load, unload, pin, delete), the catalog, pulls and imports.

Long work (pull, import) runs as a job of the shared registry; its progress bar
is an SSE stream rendered here (``/jobs/{id}/events``), the same events the
admin API streams. Every action is audited under the signed-in user.
"""

from __future__ import annotations

import anyio
from litestar import Request, Response, get, post

from appliance.catalog import Catalog
from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest, EngineUnavailable
from appliance.serving.load_plan import LoadPlanner
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.store.hub.spec import is_hub_spec
from appliance.store.jobs import JobRegistry, Work
from appliance.store.store import ModelStore
from appliance.webui import fit, forms
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.jobs_view import console_jobs, job_handlers, submit
from appliance.webui.render import page, partial


def installed_rows(store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for info in store.list():
        instance = router.instances.get(info.name)
        rows.append({
            "info": info,
            "loaded": instance is not None,
            "pinned": bool(instance and instance.pinned),
            "state": instance.engine.state if instance is not None else None,
            "in_flight": instance.inflight + instance.queue.waiting if instance is not None else 0,
            "fit": fit.installed_fit(load_planner, names, info.name) if info.status == "ready" else None,
        })
    return rows


def _catalog(store: ModelStore) -> Catalog:
    try:
        return store.catalog
    except Exception as exc:  # a broken catalog file must not hide the installed models
        raise EngineUnavailable(f"The model catalog could not be read: {exc}") from None


def catalog_rows(store: ModelStore, settings: Settings) -> list[dict[str, object]]:
    catalog = _catalog(store)
    installed = {i.name for i in store.list()}
    table = fit.catalog_fits(settings, catalog)
    families: list[dict[str, object]] = []
    for family in sorted(catalog.families.values(), key=lambda f: f.name):
        variants = []
        fits = table.get(family.name, {})
        for variant in family.variants:
            name = f"{family.name}:{variant.name}"
            variants.append({
                "entry": variant, "name": name, "installed": name in installed,
                "pullable": variant.url is not None and variant.format == "gguf",
                "fit": fits.get(variant.name, fit.UNKNOWN),
            })
        fitting = sum(1 for v in variants if v["fit"].status in ("fits", "tight"))
        families.append({"family": family, "variants": variants, "fitting": fitting, "known": bool(fits)})
    return families


def _installed(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
               message: str | None = None) -> Response:
    return partial(request, "_installed.html", rows=installed_rows(store, router, names, load_planner), message=message)


@get("/models", include_in_schema=False, sync_to_thread=True)
def models_page(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
                jobs: JobRegistry, settings: Settings) -> Response:
    return page(request, "models.html", active="models", rows=installed_rows(store, router, names, load_planner),
                catalog=catalog_rows(store, settings), jobs=console_jobs(jobs), message=None)


@get("/models/installed", include_in_schema=False, sync_to_thread=True)
def installed(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner) -> Response:
    return _installed(request, store, router, names, load_planner)


@post("/models/load", guards=[needs("operator")], include_in_schema=False)
async def load(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
               audit: AuditTrail, user: ConsoleUser) -> Response:
    instance = await router.load(names.resolve(forms.required(await request.form(), "name")))
    audit.record(user.actor, "model.load", instance.name)
    return _installed(request, store, router, names, load_planner, f"Loaded {instance.name}.")


@post("/models/unload", guards=[needs("operator")], include_in_schema=False)
async def unload(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
                 audit: AuditTrail, user: ConsoleUser) -> Response:
    name = forms.required(await request.form(), "name")
    canonical = names.resolve(name).name
    instance = router.instances.get(canonical)
    cut = instance.inflight + instance.queue.waiting if instance is not None else 0
    done = await router.unload(canonical)
    audit.record(user.actor, "model.unload", name, f"in_flight={cut}")
    ended = f" {cut} request{' was' if cut == 1 else 's were'} in flight and ended with an error." if cut else ""
    return _installed(request, store, router, names, load_planner, f"Unloaded {name}.{ended}" if done else f"{name} was not loaded.")


@post("/models/pin", guards=[needs("operator")], include_in_schema=False)
async def pin(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
              audit: AuditTrail, user: ConsoleUser) -> Response:
    form = await request.form()
    pinned = form.get("pinned") != "false"
    instance = router.pin(names.resolve(forms.required(form, "name")).name, pinned)
    audit.record(user.actor, "model.pin" if pinned else "model.unpin", instance.name)
    return _installed(request, store, router, names, load_planner, f"{'Pinned' if pinned else 'Unpinned'} {instance.name}.")


@post("/models/delete", guards=[needs("admin")], include_in_schema=False)
async def remove(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
                 audit: AuditTrail, user: ConsoleUser) -> Response:
    name = forms.required(await request.form(), "name")
    await anyio.to_thread.run_sync(lambda: store.delete(name))
    names.forget()
    audit.record(user.actor, "model.delete", name)
    return _installed(request, store, router, names, load_planner, f"Deleted {name}.")


@post("/models/default", guards=[needs("admin")], include_in_schema=False)
async def set_default(request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner,
                      audit: AuditTrail, user: ConsoleUser) -> Response:
    info = store.set_default(forms.required(await request.form(), "name"))
    names.forget()
    audit.record(user.actor, "model.default", info.name)
    return _installed(request, store, router, names, load_planner, f"{info.name} is now the default variant of {info.family}.")


def _started(request: Request, jobs: JobRegistry, names: ModelNames, audit: AuditTrail, user: ConsoleUser,
             kind: str, target: str, work: Work) -> Response:
    """Run ``work`` as a job of the shared registry, audited under the user; answer with its progress bar."""
    job = submit(jobs, names, kind, target, work)
    audit.record(user.actor, f"model.{kind}", target, f"job={job.id}")
    return partial(request, "_job.html", job=job.view())


@post("/models/pull", guards=[needs("admin")], include_in_schema=False)
async def pull(request: Request, store: ModelStore, jobs: JobRegistry, names: ModelNames, audit: AuditTrail,
               user: ConsoleUser) -> Response:
    form = await request.form()
    url, sha256, name = forms.optional(form, "url"), forms.optional(form, "sha256"), forms.optional(form, "name")
    if url is None and name is None:
        raise BadRequest("Give a URL, or pull a model from the catalog.", param="url")
    if is_hub_spec(url):
        hub = await anyio.to_thread.run_sync(lambda: store.prepare_hub_pull(url, name=name))  # type: ignore[arg-type]
        return _started(request, jobs, names, audit, user, "pull", hub.name, lambda ctx: store.pull_hub(hub, ctx=ctx).to_dict())
    url, sha256, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_pull(url, sha256=sha256, name=name))
    target = f"{family}:{variant}"
    return _started(request, jobs, names, audit, user, "pull", target,
                    lambda ctx: store.pull(url, sha256=sha256, name=target, ctx=ctx).to_dict())


@post("/models/import", guards=[needs("admin")], include_in_schema=False)
async def import_model(request: Request, store: ModelStore, jobs: JobRegistry, names: ModelNames, audit: AuditTrail,
                       user: ConsoleUser) -> Response:
    form = await request.form()
    path, name = forms.required(form, "path", limit=4096), forms.optional(form, "name")
    _source, _fmt, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_import(path, name))
    target = f"{family}:{variant}"
    return _started(request, jobs, names, audit, user, "import", target,
                    lambda ctx: store.import_path(path, name=target, ctx=ctx).to_dict())


HANDLERS = [models_page, installed, load, unload, pin, remove, set_default, pull, import_model, *job_handlers()]
