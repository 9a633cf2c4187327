"""Overview: a card per GPU and for CPU/RAM with live sparklines, loaded instances, serving figures."""

from __future__ import annotations

from litestar import Request, Response, get
from sqlalchemy.engine import Engine

from appliance.cache.responses import ResponseCache
from appliance.errors import ApplianceError
from appliance.metering.box_figures import BoxFigures
from appliance.metrics import Metrics
from appliance.serving.load_events import LoadEvents
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.webui import stats
from appliance.webui.economics_view import economics_context
from appliance.webui.render import TemplateContext, page, partial


def default_model(names: ModelNames, router: Router, load_events: LoadEvents) -> TemplateContext:
    """What ``default`` names and whether it is ready: ``state`` is loaded, cold, evicted (with by and when) or missing."""
    try:
        name = names.resolve("default").name
    except ApplianceError as exc:
        return {"name": names.aliases().get("default", "default"), "state": "missing", "reason": exc.message}
    if router.is_loaded(name):
        return {"name": name, "state": "loaded"}
    latest = load_events.latest(name)
    if latest is not None and latest.phase == "evicted":
        return {"name": name, "state": "evicted", "by": latest.evicted_by, "clock": latest.clock}
    return {"name": name, "state": "cold"}


def overview_data(
    metrics: Metrics, db: Engine, router: Router, cache: ResponseCache, names: ModelNames, load_events: LoadEvents
) -> TemplateContext:
    samples = stats.telemetry(metrics)
    return {
        "host": stats.host_card(samples),
        "gpus": stats.gpu_cards(samples),
        "serving": stats.serving(db),
        "instances": stats.instances(router),
        "cache": stats.cache_stats(cache),
        "default": default_model(names, router, load_events),
    }


@get("/", include_in_schema=False, sync_to_thread=True)
def overview(
    request: Request,
    metrics: Metrics,
    db: Engine,
    router: Router,
    cache: ResponseCache,
    names: ModelNames,
    load_events: LoadEvents,
    figures: BoxFigures,
    settings: Settings,
) -> Response:
    data = overview_data(metrics, db, router, cache, names, load_events)
    return page(request, "overview.html", active="overview", economics=economics_context(figures, settings), **data)


@get("/overview/live", include_in_schema=False, sync_to_thread=True)
def overview_live(
    request: Request,
    metrics: Metrics,
    db: Engine,
    router: Router,
    cache: ResponseCache,
    names: ModelNames,
    load_events: LoadEvents,
) -> Response:
    return partial(request, "_overview_live.html", **overview_data(metrics, db, router, cache, names, load_events))


HANDLERS = [overview, overview_live]
