"""``GET /metrics``: Prometheus text exposition of ``request.app.state.metrics``."""

from __future__ import annotations

from litestar import Controller, Request, Response, get
from appliance.api.access import Access, requires

# Litestar appends the charset to text/* media types itself.
MEDIA_TYPE = "text/plain; version=0.0.4"


class MetricsController(Controller):
    path = "/metrics"
    opt = requires(Access.METRICS)
    tags = ["metrics"]

    @get(media_type=MEDIA_TYPE)
    async def metrics(self, request: Request) -> Response:
        """Counters, histograms and gauges in Prometheus' text format (version 0.0.4)."""
        return Response(request.app.state.metrics.render(), media_type=MEDIA_TYPE)
