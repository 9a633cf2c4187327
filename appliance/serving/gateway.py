"""The request path: admit, cache, route, forward, settle (DESIGN: one pass).

The gateway never re-renders engine output: a stream is passed through as the
engine's SSE bytes (:mod:`appliance.serving.stream_relay`). The usage row and
the quota settle (:mod:`appliance.serving.books`) are committed before the final
``data: [DONE]`` (or the last byte of a plain response) is sent.

Whatever the engine processed is charged, whether the client stayed or not
(:mod:`appliance.serving.early_end` says what a request that ends early is charged).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import time
from collections.abc import AsyncIterator

from litestar import Request, Response
from litestar.response import Stream

from appliance.accounts.keys import Principal
from appliance.cache.replay import Hit
from appliance.cache.responses import ResponseCache
from appliance.errors import ApplianceError, PermissionDenied
from appliance.hardware.energy import EnergyMeter
from appliance.metering.meter import Meter
from appliance.metrics import Metrics
from appliance.openai_schema import ChatCompletionRequest, EmbeddingRequest, with_tool_choice_settled
from appliance.serving.books import RequestBooks
from appliance.serving.context import Body, RequestContext
from appliance.serving.early_end import unless_client_leaves
from appliance.serving.embedding_inputs import EmbeddingInputs
from appliance.serving.engine_client import EngineConnectionError
from appliance.serving.engine_errors import EngineAnswerError, engine_stopped, timed_out
from appliance.serving.engine_request import engine_payload, priority_headers, requested_tokens, wants_usage, with_cap
from appliance.serving.names import ModelNames
from appliance.serving.prompt_tokens import PromptCounts, prompt_bound
from appliance.serving.router import Instance, Router
from appliance.serving.schema_limits import check_request
from appliance.serving.stream_relay import relay
from appliance.serving.timing import SCOPE_KEY, RequestTiming
from appliance.settings import Settings
from appliance.store.store import ResolvedVariant

log = logging.getLogger("appliance.serving.gateway")


class Gateway:
    def __init__(
        self,
        settings: Settings,
        names: ModelNames,
        router: Router,
        meter: Meter,
        *,
        cache: ResponseCache | None = None,
        metrics: Metrics | None = None,
        energy: EnergyMeter | None = None,
        prompts: PromptCounts | None = None,
        embedding_inputs: EmbeddingInputs | None = None,
    ):
        self.settings = settings
        self.names = names
        self.router = router
        self.meter = meter
        self.books = RequestBooks(meter, metrics, energy)
        self.cache = cache
        self.prompts = prompts
        self.embedding_inputs = (
            embedding_inputs if embedding_inputs is not None else EmbeddingInputs(settings.embedding_inputs_in_flight_per_key)
        )

    def metered_by(self, meter: Meter) -> Gateway:
        """The same gateway (router, cache, limits shared) whose admissions, settles and releases go through ``meter``."""
        other = copy.copy(self)
        other.meter = meter
        other.books = RequestBooks(meter, self.books.metrics, self.books.energy)
        return other

    # ------------------------------------------------------------------ entry
    async def handle(
        self, request: Request, principal: Principal, endpoint: str, body: Body, *, ledger_endpoint: str | None = None
    ) -> Response:
        """Serve one OpenAI-compatible request for ``principal`` (authenticated by the access guard).

        ``ledger_endpoint`` names the endpoint in the usage ledger when the client spoke
        another API than the engine serves (``messages``, served as ``chat``). An
        embeddings request holds its inputs against the key's cap on embedding inputs
        in flight until it is answered (429 past it, before any other work).
        """
        if isinstance(body, EmbeddingRequest):
            inputs = len(body.input) if isinstance(body.input, list) else 1
            with self.embedding_inputs.hold(f"{principal.kind}:{principal.id}", inputs):
                return await self._handle(request, principal, endpoint, body, ledger_endpoint)
        return await self._handle(request, principal, endpoint, body, ledger_endpoint)

    async def _handle(
        self, request: Request, principal: Principal, endpoint: str, body: Body, ledger_endpoint: str | None
    ) -> Response:
        if isinstance(body, ChatCompletionRequest):
            body = with_tool_choice_settled(body)
        if not isinstance(body, EmbeddingRequest):
            check_request(body)  # schema and logit_bias limits, before any work, for every engine
        target = self._allowed(principal, body)
        ctx = RequestContext(
            principal=principal,
            endpoint=endpoint,
            target=target,
            body=body,
            headers=request.headers,
            stream=bool(getattr(body, "stream", False)),
            ledger_endpoint=ledger_endpoint or endpoint,
        )
        timing = request.scope.get(SCOPE_KEY)
        if isinstance(timing, RequestTiming):
            ctx.timing = timing
        ctx.timing.endpoint = ctx.ledger_endpoint

        if self.cache is not None and not isinstance(body, EmbeddingRequest):  # embeddings are not cached
            hit = await self.cache.lookup_async(principal, endpoint, ctx.model, body, request.headers)
            if hit is not None:
                return await self._serve_cached(ctx, hit)

        counted = await self.prompts.count(target, endpoint, body) if self.prompts is not None else None
        prompt = counted if counted is not None else prompt_bound(body)
        ctx.prompt_charge = prompt  # exact for GGUF models; elsewhere the bound the reservation holds
        if isinstance(body, EmbeddingRequest):
            ctx.admission = await self.meter.admit(
                principal, request_id=ctx.request_id, endpoint=ctx.ledger_endpoint, model=ctx.model, estimated_tokens=prompt
            )
        else:
            # reserve the prompt, then cap the completion to what the key's and team's budgets have left
            ctx.admission = await self.meter.admit(
                principal,
                request_id=ctx.request_id,
                endpoint=ctx.ledger_endpoint,
                model=ctx.model,
                estimated_tokens=prompt,
                cap=True,
                max_tokens=requested_tokens(body) or self._context(ctx.model),
            )
            ctx.body = with_cap(body, ctx.admission.max_tokens)
        payload = engine_payload(ctx)
        self.books.begin(ctx)
        try:
            if ctx.stream:
                return await self._stream(ctx, payload)
            return await unless_client_leaves(request, self._plain(ctx, payload))
        except BaseException as exc:
            status = exc.status if isinstance(exc, ApplianceError) else 499
            # the client left or the deadline passed after the engine took the request: it read the prompt
            await self.books.fail(ctx, status, 0, ctx.prompt_charge if ctx.engine_took and status in (499, 504) else 0)
            raise

    def _allowed(self, principal: Principal, body: Body) -> ResolvedVariant:
        """The variant ``body`` names, if ``principal`` may use it."""
        target = self.names.resolve(body.model)
        if not principal.may_use(target.name):
            raise PermissionDenied(f"This key may not use the model `{body.model}`.", param="model", code="model_not_allowed")
        return target

    async def prompt_tokens(self, principal: Principal, endpoint: str, body: Body) -> int | None:
        """The prompt tokens ``body`` would be billed (``None`` where the gateway cannot count them); nothing is admitted."""
        target = self._allowed(principal, body)
        return await self.prompts.count(target, endpoint, body) if self.prompts is not None else None

    def _context(self, name: str) -> int | None:
        """The loaded model's context, the most a request without max_tokens can generate (None if not loaded)."""
        instance = self.router.instances.get(name)
        return instance.plan.context if instance is not None and instance.plan.context > 0 else None

    def _headers(self, ctx: RequestContext, tier: str = "miss") -> dict[str, str]:
        return {**ctx.admitted().headers, "x-cache": tier, "x-request-id": ctx.request_id}

    # ------------------------------------------------------------- plain call
    def _deadline(self, ctx: RequestContext) -> float:
        """The event-loop time by which the whole request (queue, generation, stream) must be done."""
        return asyncio.get_running_loop().time() + self.settings.request_timeout_seconds - (time.perf_counter() - ctx.started)

    async def _plain(self, ctx: RequestContext, payload: bytes) -> Response:
        try:
            async with asyncio.timeout_at(self._deadline(ctx)):
                async with self._lease(ctx) as instance:
                    with ctx.waiting_for_engine():
                        ctx.engine_took = True
                        response = await instance.engine.client.request(
                            "POST", instance.engine.route(ctx.endpoint), payload, headers=priority_headers(ctx)
                        )
                        content = await response.read()
        except TimeoutError:  # the engine stops when its connection closes
            raise timed_out(ctx.model, self.settings.request_timeout_seconds) from None
        except EngineConnectionError:
            raise engine_stopped(ctx.model) from None
        if response.status != 200:
            raise EngineAnswerError(response.status, content)
        result = json.loads(content)
        # without a stream the first token reaches the client with the whole answer
        await self.books.settle(ctx, instance.backend, result.get("usage") or {}, 0, ctx.elapsed_ms())
        if self.cache is not None and not isinstance(ctx.body, EmbeddingRequest):
            self.cache.store(ctx.principal, ctx.endpoint, ctx.model, ctx.body, result, ctx.headers)
        return Response(content=content, media_type="application/json", headers=self._headers(ctx))

    @contextlib.asynccontextmanager
    async def _lease(self, ctx: RequestContext) -> AsyncIterator[Instance]:
        """The router's lease, the wait for it (a slot, or the model's load) counted as the engine's time."""
        lease = self.router.lease(ctx.target, ctx.principal.priority)
        with ctx.waiting_for_engine():
            instance = await lease.__aenter__()
        try:
            yield instance
        except BaseException as exc:
            if not await lease.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await lease.__aexit__(None, None, None)

    # ---------------------------------------------------------------- streams
    async def _stream(self, ctx: RequestContext, payload: bytes) -> Response:
        deadline = self._deadline(ctx)
        lease = self.router.lease(ctx.target, ctx.principal.priority)
        try:
            async with asyncio.timeout_at(deadline):
                with ctx.waiting_for_engine():  # a slot, or the model's load, is the engine's time
                    instance = await lease.__aenter__()
        except TimeoutError:
            raise timed_out(ctx.model, self.settings.request_timeout_seconds) from None
        try:
            async with asyncio.timeout_at(deadline):
                with ctx.waiting_for_engine():
                    upstream = await instance.engine.client.request(
                        "POST", instance.engine.route(ctx.endpoint), payload, headers=priority_headers(ctx)
                    )
                    if upstream.status != 200:
                        raise EngineAnswerError(upstream.status, await upstream.read())
                    ctx.engine_took = True  # the engine has the prompt and started its answer
        except TimeoutError:
            await lease.__aexit__(None, None, None)
            raise timed_out(ctx.model, self.settings.request_timeout_seconds) from None
        except EngineConnectionError:
            await lease.__aexit__(None, None, None)
            raise engine_stopped(ctx.model) from None
        except BaseException as exc:
            await lease.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        events = relay(
            ctx,
            upstream,
            lease,
            instance,
            deadline,
            books=self.books,
            cache=self.cache,
            timeout_seconds=self.settings.request_timeout_seconds,
        )
        return Stream(events, media_type="text/event-stream", headers={**self._headers(ctx), "cache-control": "no-cache"})

    # ------------------------------------------------------------------ cache
    async def _serve_cached(self, ctx: RequestContext, hit: Hit) -> Response:
        ctx.admission = await self.meter.admit(
            ctx.principal,
            request_id=ctx.request_id,
            endpoint=ctx.ledger_endpoint,
            model=ctx.model,
            estimated_tokens=hit.prompt_tokens + hit.completion_tokens,
            cached=True,
        )
        usage = {
            "prompt_tokens": hit.prompt_tokens,
            "completion_tokens": hit.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": hit.prompt_tokens},
        }
        await self.books.settle(ctx, None, usage, 0, ctx.elapsed_ms(), hit.tier)
        headers = self._headers(ctx, hit.tier)
        if hit.similarity is not None:
            headers["x-cache-similarity"] = f"{hit.similarity:.4f}"
        if ctx.stream:
            return Stream(hit.as_sse(wants_usage(ctx.body)), media_type="text/event-stream", headers=headers)
        return Response(content=hit.body, media_type="application/json", headers=headers)
