"""``GET /metrics``: Prometheus text exposition of the daemon's :class:`~appliance.metrics.Metrics`."""

from __future__ import annotations

from litestar import Controller, Response, get

from appliance.api.access import Access, requires
from appliance.metrics import Metrics

# Litestar appends the charset to text/* media types itself.
MEDIA_TYPE = "text/plain; version=0.0.4"


class MetricsController(Controller):
    path = "/metrics"
    opt = requires(Access.METRICS)
    tags = ["metrics"]

    @get(media_type=MEDIA_TYPE)
    async def render(self, metrics: Metrics) -> Response:
        """Counters, histograms and gauges in Prometheus' text format (version 0.0.4)."""
        return Response(metrics.render(), media_type=MEDIA_TYPE)
