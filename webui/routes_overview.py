"""Overview: a card per GPU and for CPU/RAM with live sparklines, loaded instances, serving figures."""

from __future__ import annotations

from litestar import Request, Response, get
from sqlalchemy.engine import Engine

from appliance.cache.responses import ResponseCache
from appliance.metrics import Metrics
from appliance.serving.router import Router
from appliance.webui import stats
from appliance.webui.render import TemplateContext, page, partial


def overview_data(metrics: Metrics, db: Engine, router: Router, cache: ResponseCache) -> TemplateContext:
    samples = stats.telemetry(metrics)
    return {
        "host": stats.host_card(samples),
        "gpus": stats.gpu_cards(samples),
        "serving": stats.serving(db),
        "instances": stats.instances(router),
        "cache": stats.cache_stats(cache),
    }


@get("/", include_in_schema=False, sync_to_thread=True)
def overview(request: Request, metrics: Metrics, db: Engine, router: Router, cache: ResponseCache) -> Response:
    return page(request, "overview.html", active="overview", **overview_data(metrics, db, router, cache))


@get("/overview/live", include_in_schema=False, sync_to_thread=True)
def overview_live(request: Request, metrics: Metrics, db: Engine, router: Router, cache: ResponseCache) -> Response:
    return partial(request, "_overview_live.html", **overview_data(metrics, db, router, cache))


HANDLERS = [overview, overview_live]
