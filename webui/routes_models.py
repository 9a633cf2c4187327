"""Models: installed variants (load, unload, pin, delete), the catalog, pulls and imports.

Long work (pull, import) runs as a job of the shared registry; its progress bar
is an SSE stream rendered here (``/jobs/{id}/events``), the same events the
admin API streams. Loads stream their phases and plan to each model's row
(``/models/loads``, :mod:`appliance.webui.load_view`). The catalog is searched
and filtered in place (``/models/catalog``, :mod:`appliance.webui.catalog_filter`).
Every action is audited under the signed-in user.
"""

from __future__ import annotations

import time

import anyio
from litestar import Request, Response, get, post

from appliance.catalog import Catalog
from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest, EngineUnavailable
from appliance.modelfacts.capabilities import is_base
from appliance.serving.load_events import LoadEvents
from appliance.serving.load_plan import LoadPlanner
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.settings.runtime import RuntimeSettings
from appliance.store.jobs import JobRegistry, Work
from appliance.store.store import ModelStore
from appliance.webui import fit, forms
from appliance.webui.catalog_filter import CatalogFilter
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.jobs_view import console_jobs, job_handlers, submit
from appliance.webui.load_view import event_name, load_handlers
from appliance.webui.render import TemplateContext, page, partial


def installed_rows(
    store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner, load_events: LoadEvents
) -> list[TemplateContext]:
    rows: list[TemplateContext] = []
    infos = store.list()
    appliance_default = names.aliases()["default"]  # the default_model setting: a variant, or a family's default variant
    available = fit.available_fits(store, infos)  # listed on the hub, not downloaded: planned from a ready sibling
    for info in infos:
        instance = router.instances.get(info.name)
        latest = load_events.latest(info.name)
        needed = latest.plan.estimated_bytes if latest is not None and latest.plan is not None else 0
        rows.append(
            {
                "info": info,
                "loaded": instance is not None,
                "pinned": bool(instance and instance.pinned),
                "state": instance.engine.state if instance is not None else None,
                "in_flight": instance.inflight + instance.queue.waiting if instance is not None else 0,
                "fit": fit.installed_fit(load_planner, names, info.name) if info.status == "ready" else available.get(info.name),
                "base": is_base(info.facts),
                "appliance_default": appliance_default in (info.name, info.family if info.is_default else None),
                "current_default": appliance_default,
                "load": latest,
                # what Load would stop to make room (max_loaded_instances, memory_budget_gib): Load asks first
                "evicts": [
                    {"name": v.name, "in_flight": v.inflight + v.queue.waiting, "idle_seconds": time.monotonic() - v.last_used}
                    for v in router.would_evict(info.name, needed)
                ]
                if info.status == "ready"
                else [],
                "load_event": event_name(info.name),
            }
        )
    return rows


def _catalog(store: ModelStore) -> Catalog:
    try:
        return store.catalog
    except Exception as exc:  # a broken catalog file must not hide the installed models
        raise EngineUnavailable(f"The model catalog could not be read: {exc}") from None


def catalog_rows(store: ModelStore, settings: Settings, wanted: CatalogFilter | None = None) -> list[TemplateContext]:
    """The catalog's families with each variant's fit on this box, narrowed to what ``wanted`` asks for."""
    catalog = _catalog(store)
    installed = {i.name for i in store.list()}
    table = fit.catalog_fits(settings, catalog)
    wanted = wanted or CatalogFilter()
    families: list[TemplateContext] = []
    for family in sorted(catalog.families.values(), key=lambda f: f.name):
        variants: list[TemplateContext] = []
        fits = table.get(family.name, {})
        for variant in family.variants:
            name = f"{family.name}:{variant.name}"
            row_fit = fits.get(variant.name, fit.UNKNOWN)
            if not wanted.accepts(family, variant, row_fit):
                continue
            variants.append(
                {
                    "entry": variant,
                    "name": name,
                    "installed": name in installed,
                    "pullable": variant.url is not None and variant.format == "gguf",
                    "fit": row_fit,
                }
            )
        if not variants:
            continue
        fitting = sum(1 for v in variants if v["fit"].status in ("fits", "tight"))
        families.append({"family": family, "variants": variants, "fitting": fitting, "known": bool(fits)})
    return families


def _installed(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    message: str | None = None,
) -> Response:
    return partial(
        request, "_installed.html", rows=installed_rows(store, router, names, load_planner, load_events), message=message
    )


@get("/models", include_in_schema=False, sync_to_thread=True)
def models_page(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    jobs: JobRegistry,
    settings: Settings,
) -> Response:
    wanted = CatalogFilter.from_query(request.query_params)
    return page(
        request,
        "models.html",
        active="models",
        rows=installed_rows(store, router, names, load_planner, load_events),
        catalog=catalog_rows(store, settings, wanted),
        wanted=wanted,
        jobs=console_jobs(jobs),
        message=None,
    )


@get("/models/installed", include_in_schema=False, sync_to_thread=True)
def installed(
    request: Request, store: ModelStore, router: Router, names: ModelNames, load_planner: LoadPlanner, load_events: LoadEvents
) -> Response:
    return _installed(request, store, router, names, load_planner, load_events)


@get("/models/catalog", include_in_schema=False, sync_to_thread=True)
def catalog(request: Request, store: ModelStore, settings: Settings) -> Response:
    """The catalog narrowed by the search form (text, fits this box, format), swapped in place."""
    wanted = CatalogFilter.from_query(request.query_params)
    return partial(request, "_catalog.html", catalog=catalog_rows(store, settings, wanted), wanted=wanted)


@post("/models/load", guards=[needs("operator")], include_in_schema=False)
async def load(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    instance = await router.load(names.resolve(forms.required(await request.form(), "name")))
    audit.record(user.actor, "model.load", instance.name)
    return _installed(request, store, router, names, load_planner, load_events, f"Loaded {instance.name}.")


@post("/models/unload", guards=[needs("operator")], include_in_schema=False)
async def unload(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    name = forms.required(await request.form(), "name")
    canonical = names.resolve(name).name
    instance = router.instances.get(canonical)
    cut = instance.inflight + instance.queue.waiting if instance is not None else 0
    done = await router.unload(canonical)
    audit.record(user.actor, "model.unload", name, f"in_flight={cut}")
    ended = f" {cut} request{' was' if cut == 1 else 's were'} in flight and ended with an error." if cut else ""
    return _installed(
        request,
        store,
        router,
        names,
        load_planner,
        load_events,
        f"Unloaded {name}.{ended}" if done else f"{name} was not loaded.",
    )


@post("/models/pin", guards=[needs("operator")], include_in_schema=False)
async def pin(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    form = await request.form()
    pinned = form.get("pinned") != "false"
    instance = router.pin(names.resolve(forms.required(form, "name")).name, pinned)
    audit.record(user.actor, "model.pin" if pinned else "model.unpin", instance.name)
    return _installed(
        request, store, router, names, load_planner, load_events, f"{'Pinned' if pinned else 'Unpinned'} {instance.name}."
    )


@post("/models/delete", guards=[needs("admin")], include_in_schema=False)
async def remove(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    name = forms.required(await request.form(), "name")
    await anyio.to_thread.run_sync(lambda: store.delete(name))
    names.forget()
    load_events.forget(name)
    audit.record(user.actor, "model.delete", name)
    return _installed(request, store, router, names, load_planner, load_events, f"Deleted {name}.")


@post("/models/default", guards=[needs("admin")], include_in_schema=False)
async def set_default(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    info = store.set_default(forms.required(await request.form(), "name"))
    names.forget()
    audit.record(user.actor, "model.default", info.name)
    return _installed(
        request, store, router, names, load_planner, load_events, f"{info.name} is now the default variant of {info.family}."
    )


@post("/models/appliance-default", guards=[needs("admin")], include_in_schema=False)
async def make_appliance_default(
    request: Request,
    store: ModelStore,
    router: Router,
    names: ModelNames,
    load_planner: LoadPlanner,
    load_events: LoadEvents,
    runtime_settings: RuntimeSettings,
    user: ConsoleUser,
) -> Response:
    """Make an installed variant the one `default` names: the default_model setting, changed and audited as PATCH
    /admin/settings changes it."""
    name = forms.required(await request.form(), "name")
    info = await anyio.to_thread.run_sync(store.resolve, name)  # installed and ready, or ModelNotFound
    await anyio.to_thread.run_sync(runtime_settings.change, user.actor, {"default_model": info.name})
    return _installed(
        request, store, router, names, load_planner, load_events, f"{info.name} is now the appliance's default model."
    )


def _started(
    request: Request,
    jobs: JobRegistry,
    names: ModelNames,
    audit: AuditTrail,
    user: ConsoleUser,
    kind: str,
    target: str,
    work: Work,
) -> Response:
    """Run ``work`` as a job of the shared registry, audited under the user; answer with its progress bar."""
    job = submit(jobs, names, kind, target, work)
    audit.record(user.actor, f"model.{kind}", target, f"job={job.id}")
    return partial(request, "_job.html", job=job.view())


@post("/models/pull", guards=[needs("admin")], include_in_schema=False)
async def pull(
    request: Request, store: ModelStore, jobs: JobRegistry, names: ModelNames, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    url, sha256, name = forms.optional(form, "url"), forms.optional(form, "sha256"), forms.optional(form, "name")
    if url is None and name is None:
        raise BadRequest("Give a URL, or pull a model from the catalog.", param="url")
    hub = await anyio.to_thread.run_sync(
        lambda: store.prepare_requested_pull(url, name, sha256=sha256)
    )  # a hub spec, or an available variant
    if hub is not None:
        return _started(request, jobs, names, audit, user, "pull", hub.name, lambda ctx: store.pull_hub(hub, ctx=ctx).to_dict())
    url, sha256, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_pull(url, sha256=sha256, name=name))
    target = f"{family}:{variant}"
    return _started(
        request,
        jobs,
        names,
        audit,
        user,
        "pull",
        target,
        lambda ctx: store.pull(url, sha256=sha256, name=target, ctx=ctx).to_dict(),
    )


@post("/models/import", guards=[needs("admin")], include_in_schema=False)
async def import_model(
    request: Request, store: ModelStore, jobs: JobRegistry, names: ModelNames, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    path, name = forms.required(form, "path", limit=4096), forms.optional(form, "name")
    _source, _fmt, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_import(path, name))
    target = f"{family}:{variant}"
    return _started(
        request, jobs, names, audit, user, "import", target, lambda ctx: store.import_path(path, name=target, ctx=ctx).to_dict()
    )


HANDLERS = [
    models_page,
    installed,
    catalog,
    load,
    unload,
    pin,
    remove,
    set_default,
    make_appliance_default,
    pull,
    import_model,
    *job_handlers(),
    *load_handlers(),
]
