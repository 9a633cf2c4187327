"""Overview: a card per GPU and for CPU/RAM with live sparklines, loaded instances, serving figures."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from appliance.webui import stats
from appliance.webui.context import services
from appliance.webui.render import page, partial


def overview_data(request: Request) -> dict[str, Any]:
    svc = services(request)
    samples = stats.telemetry(svc)
    return {
        "host": stats.host_card(samples),
        "gpus": stats.gpu_cards(samples),
        "serving": stats.serving(svc.db),
        "instances": stats.instances(svc),
        "cache": stats.cache_stats(svc),
    }


@get("/", include_in_schema=False, sync_to_thread=True)
def overview(request: Request) -> Response:
    return page(request, "overview.html", active="overview", **overview_data(request))


@get("/overview/live", include_in_schema=False, sync_to_thread=True)
def overview_live(request: Request) -> Response:
    return partial(request, "_overview_live.html", **overview_data(request))


HANDLERS = [overview, overview_live]
