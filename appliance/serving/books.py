"""Each request's outcome in the books: the usage row and the quota settle, or the charge of a request that failed or
ended early, and the request's figures in the metrics.

Both are durable before they return, so the gateway can send the final byte (``data: [DONE]``) only after them.
"""

from __future__ import annotations

from appliance.hardware.energy import EnergyMeter
from appliance.jsontypes import JsonObject
from appliance.metering.meter import Meter
from appliance.metrics import Metrics
from appliance.serving.context import RequestContext


class RequestBooks:
    def __init__(self, meter: Meter, metrics: Metrics | None = None, energy: EnergyMeter | None = None):
        self.meter = meter
        self.metrics = metrics
        self.energy = energy

    def begin(self, ctx: RequestContext) -> None:
        """Mark where the request's engine work starts, for the energy it is charged."""
        ctx.energy = self.energy.begin() if self.energy is not None else None

    def _energy(self, ctx: RequestContext) -> float | None:
        return self.energy.end(ctx.energy) if ctx.energy is not None and self.energy is not None else None

    async def settle(
        self,
        ctx: RequestContext,
        backend: str | None,
        usage: JsonObject,
        completion_default: int,
        ttft_ms: float | None,
        tier: str = "miss",
    ) -> None:
        """Write the usage row and settle quotas (durable before returning), then count the request."""
        latency_ms = ctx.elapsed_ms()
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or completion_default)
        cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        energy = self._energy(ctx)
        await self.meter.settle(
            ctx.admitted(),
            model=ctx.model,
            variant=ctx.target.variant,
            backend=backend,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
            status=200,
            cache_tier=tier,
            energy_joules=energy,
        )
        if self.metrics is not None:
            self.metrics.observe_request(
                ctx.model, 200, ttft_ms, latency_ms, prompt_tokens, completion_tokens, tier, energy, cached_tokens=cached_tokens
            )

    async def fail(self, ctx: RequestContext, status: int, completion_tokens: int, prompt_tokens: int = 0) -> None:
        """Record what a failed or abandoned request produced (charged), with its real status, and free the rest."""
        energy = self._energy(ctx)
        await self.meter.release(
            ctx.admitted(), status=status, model=ctx.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        if self.metrics is not None:
            self.metrics.observe_request(ctx.model, status, None, ctx.elapsed_ms(), 0, completion_tokens, "miss", energy)
