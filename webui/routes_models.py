"""Models: installed variants (load, unload, pin, delete), the catalog, pulls and imports.

Long work (pull, import) runs as a job of the shared registry; its progress bar
is an SSE stream rendered here (``/jobs/{id}/events``), the same events the
admin API streams. Every action is audited under the signed-in user.
"""

from __future__ import annotations

from typing import Any

import anyio

from litestar import Request, Response, get, post
from litestar.datastructures import FormMultiDict

from appliance.errors import BadRequest, EngineUnavailable
from appliance.webui import fit
from appliance.webui.context import audit, services
from appliance.webui.gate import needs
from appliance.webui.jobs_view import job_handlers, submit
from appliance.webui.render import page, partial


def _field(form: FormMultiDict, name: str, *, required: bool = True, limit: int = 2048) -> str | None:
    value = form.get(name)
    value = value.strip() if isinstance(value, str) else ""
    if not value:
        if required:
            raise BadRequest(f"{name} is required.", param=name)
        return None
    if len(value) > limit:
        raise BadRequest(f"{name} is too long.", param=name)
    return value


def installed_rows(request: Request) -> list[dict[str, Any]]:
    svc = services(request)
    store = getattr(svc, "store", None)
    if store is None:
        return []
    router = getattr(svc, "router", None)
    loaded = router.instances if router is not None else {}
    rows = []
    for info in store.list():
        instance = loaded.get(info.name)
        rows.append({
            "info": info,
            "loaded": instance is not None,
            "pinned": bool(instance and instance.pinned),
            "state": instance.engine.state if instance is not None else None,
            "fit": fit.installed_fit(svc, info.name) if info.status == "ready" else None,
        })
    return rows


def catalog_rows(request: Request) -> list[dict[str, Any]]:
    svc = services(request)
    store = getattr(svc, "store", None)
    try:
        catalog = store.catalog if store is not None else __import__("appliance.catalog", fromlist=["load_catalog"]).load_catalog()
    except Exception as exc:  # a broken catalog file must not hide the installed models
        raise EngineUnavailable(f"The model catalog could not be read: {exc}") from None
    installed = {i.name for i in store.list()} if store is not None else set()
    table = fit.catalog_fits(svc, catalog)
    families = []
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


def _models_partial(request: Request, message: str | None = None) -> Response:
    return partial(request, "_installed.html", rows=installed_rows(request), message=message)


@get("/models", include_in_schema=False, sync_to_thread=True)
def models_page(request: Request) -> Response:
    svc = services(request)
    jobs = getattr(svc, "jobs", None)
    recent = [j for j in jobs.list() if j.kind in ("pull", "import", "verify", "quantize")][:8] if jobs is not None else []
    return page(request, "models.html", active="models", rows=installed_rows(request), catalog=catalog_rows(request),
                store_available=getattr(svc, "store", None) is not None, jobs=recent, message=None)


@get("/models/installed", include_in_schema=False, sync_to_thread=True)
def installed(request: Request) -> Response:
    return _models_partial(request)


def _router(request: Request) -> Any:
    router = getattr(services(request), "router", None)
    if router is None:
        raise EngineUnavailable("The model router is not running.")
    return router


@post("/models/load", guards=[needs("operator")], include_in_schema=False)
async def load(request: Request) -> Response:
    name = _field(await request.form(), "name")
    instance = await _router(request).load(name)
    audit(request, "model.load", instance.name)
    return _models_partial(request, f"Loaded {instance.name}.")


@post("/models/unload", guards=[needs("operator")], include_in_schema=False)
async def unload(request: Request) -> Response:
    name = _field(await request.form(), "name")
    done = await _router(request).unload(name)
    audit(request, "model.unload", name)
    return _models_partial(request, f"Unloaded {name}." if done else f"{name} was not loaded.")


@post("/models/pin", guards=[needs("operator")], include_in_schema=False)
async def pin(request: Request) -> Response:
    form = await request.form()
    name = _field(form, "name")
    pinned = form.get("pinned") != "false"
    instance = _router(request).pin(name, pinned)
    audit(request, "model.pin" if pinned else "model.unpin", instance.name)
    return _models_partial(request, f"{'Pinned' if pinned else 'Unpinned'} {instance.name}.")


def _store(request: Request) -> Any:
    store = getattr(services(request), "store", None)
    if store is None:
        raise EngineUnavailable("The model store is not available.")
    return store


@post("/models/delete", guards=[needs("admin")], include_in_schema=False)
async def remove(request: Request) -> Response:
    name = _field(await request.form(), "name")
    store = _store(request)
    await anyio.to_thread.run_sync(lambda: store.delete(name))
    services(request).names_changed()
    audit(request, "model.delete", name)
    return _models_partial(request, f"Deleted {name}.")


@post("/models/default", guards=[needs("admin")], include_in_schema=False)
async def set_default(request: Request) -> Response:
    name = _field(await request.form(), "name")
    info = _store(request).set_default(name)
    services(request).names_changed()
    audit(request, "model.default", info.name)
    return _models_partial(request, f"{info.name} is now the default variant of {info.family}.")


@post("/models/pull", guards=[needs("admin")], include_in_schema=False)
async def pull(request: Request) -> Response:
    form = await request.form()
    store = _store(request)
    url, sha256, name = _field(form, "url", required=False), _field(form, "sha256", required=False), _field(form, "name", required=False)
    if url is None and name is None:
        raise BadRequest("Give a URL, or pull a model from the catalog.", param="url")
    url, sha256, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_pull(url, sha256=sha256, name=name))
    target = f"{family}:{variant}"
    job = submit(request, "pull", target, lambda ctx: store.pull(url, sha256=sha256, name=target, ctx=ctx))
    audit(request, "model.pull", target, f"job={job.id}")
    return partial(request, "_job.html", job=job.view())


@post("/models/import", guards=[needs("admin")], include_in_schema=False)
async def import_model(request: Request) -> Response:
    form = await request.form()
    store = _store(request)
    path, name = _field(form, "path", limit=4096), _field(form, "name", required=False)
    _source, _fmt, family, variant = await anyio.to_thread.run_sync(lambda: store.prepare_import(path, name))
    target = f"{family}:{variant}"
    job = submit(request, "import", target, lambda ctx: store.import_path(path, name=target, ctx=ctx))
    audit(request, "model.import", target, f"job={job.id}")
    return partial(request, "_job.html", job=job.view())


HANDLERS = [models_page, installed, load, unload, pin, remove, set_default, pull, import_model, *job_handlers()]
