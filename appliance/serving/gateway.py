"""The request path: admit, cache, route, forward, settle (DESIGN: one pass).

The gateway never re-renders engine output. Streams are passed through as the
engine's SSE bytes; the only per-token work is finding event boundaries and
counting events, and only the final usage event is parsed. The usage row and
the quota settle are committed before the final ``data: [DONE]`` (or the last
byte of a plain response) is sent.

Whatever the engine processed is charged, whether the client stayed or not
(:mod:`appliance.serving.early_end` says what a request that ends early is charged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from appliance.accounts.keys import Principal
from appliance.cache.replay import Hit
from appliance.cache.responses import ResponseCache
from appliance.errors import ApplianceError, EngineTimeout, EngineUnavailable, PermissionDenied, error_envelope
from appliance.hardware.energy import EnergyMeter
from appliance.jsontypes import JsonObject
from appliance.metering.meter import Meter
from appliance.metrics import Metrics
from appliance.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    for_engine,
    with_tool_choice_settled,
)
from appliance.serving.context import Body, RequestContext
from appliance.serving.early_end import prompt_read, role_only, unless_client_leaves
from appliance.serving.embedding_inputs import EmbeddingInputs
from appliance.serving.engine_client import PRIORITY_HEADER, EngineConnectionError, EngineResponse
from appliance.serving.names import ModelNames
from appliance.serving.prompt_tokens import PromptCounts, prompt_bound
from appliance.serving.router import Instance, Router
from appliance.serving.schema_limits import check_request
from appliance.serving.timing import SCOPE_KEY, RequestTiming
from appliance.settings import Settings
from appliance.store.store import ResolvedVariant

log = logging.getLogger("appliance.serving.gateway")

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def _priority(ctx: RequestContext) -> dict[str, str]:
    """The header telling the engine which latency class the request is in (its key's priority; batch lines: ``batch``)."""
    return {PRIORITY_HEADER: ctx.principal.priority}


def _engine_stopped(name: str) -> EngineUnavailable:
    return EngineUnavailable(
        f"The engine serving `{name}` stopped; it is being restarted. Retry shortly.", headers={"Retry-After": "2"}
    )


def requested_tokens(body: Body) -> int | None:
    """The completion tokens a request asks for (``None``: as many as the engine gives; 0: a prompt scored with echo)."""
    requested = getattr(body, "max_completion_tokens", None)
    return requested if requested is not None else getattr(body, "max_tokens", None)


B = TypeVar("B", bound=ChatCompletionRequest | CompletionRequest | EmbeddingRequest)


def with_cap(body: B, cap: int | None) -> B:
    """``body`` asking for at most ``cap`` completion tokens (unchanged if it already asks for no more)."""
    requested = requested_tokens(body)
    if cap is None or (requested is not None and requested <= cap):
        return body
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return msgspec.structs.replace(body, max_tokens=cap, max_completion_tokens=cap)
    return msgspec.structs.replace(body, max_tokens=cap)


class EngineAnswerError(ApplianceError):
    """An error the engine answered with, passed through with its status."""

    def __init__(self, status: int, body: bytes):
        try:
            error = json.loads(body)["error"]
            message, type_, param, code = (
                error.get("message", ""),
                error.get("type", "invalid_request_error"),
                error.get("param"),
                error.get("code"),
            )
        except (ValueError, KeyError, TypeError):
            message, type_, param, code = body[:300].decode("utf-8", "replace") or "engine error", "server_error", None, None
        super().__init__(message, param=param, code=code)
        self.status = status
        self.type = type_


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
        self.cache = cache
        self.metrics = metrics
        self.energy = energy
        self.prompts = prompts
        self.embedding_inputs = (
            embedding_inputs if embedding_inputs is not None else EmbeddingInputs(settings.embedding_inputs_in_flight_per_key)
        )

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
        forward = for_engine(ctx.body, model=ctx.model)
        if ctx.stream:
            forward = msgspec.structs.replace(forward, stream_options={"include_usage": True})
        payload = _encoder.encode(forward)
        ctx.energy = self.energy.begin() if self.energy is not None else None
        try:
            if ctx.stream:
                return await self._stream(ctx, payload)
            return await unless_client_leaves(request, self._plain(ctx, payload))
        except BaseException as exc:
            status = exc.status if isinstance(exc, ApplianceError) else 499
            # the client left or the deadline passed after the engine took the request: it read the prompt
            await self._fail(ctx, status, 0, ctx.prompt_charge if ctx.engine_took and status in (499, 504) else 0)
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

    # ------------------------------------------------------------ accounting
    def _energy(self, ctx: RequestContext) -> float | None:
        return self.energy.end(ctx.energy) if ctx.energy is not None and self.energy is not None else None

    async def _settle(
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

    async def _fail(self, ctx: RequestContext, status: int, completion_tokens: int, prompt_tokens: int = 0) -> None:
        """Record what a failed or abandoned request produced (charged), with its real status, and free the rest."""
        energy = self._energy(ctx)
        await self.meter.release(
            ctx.admitted(), status=status, model=ctx.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        if self.metrics is not None:
            self.metrics.observe_request(ctx.model, status, None, ctx.elapsed_ms(), 0, completion_tokens, "miss", energy)

    def _headers(self, ctx: RequestContext, tier: str = "miss") -> dict[str, str]:
        return {**ctx.admitted().headers, "x-cache": tier, "x-request-id": ctx.request_id}

    # ------------------------------------------------------------- plain call
    def _timed_out(self, ctx: RequestContext) -> EngineTimeout:
        return EngineTimeout(
            f"The model `{ctx.model}` did not finish within request_timeout_seconds "
            f"({self.settings.request_timeout_seconds:g} s)."
        )

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
                            "POST", instance.engine.route(ctx.endpoint), payload, headers=_priority(ctx)
                        )
                        content = await response.read()
        except TimeoutError:  # the engine stops when its connection closes
            raise self._timed_out(ctx) from None
        except EngineConnectionError:
            raise _engine_stopped(ctx.model) from None
        if response.status != 200:
            raise EngineAnswerError(response.status, content)
        result = json.loads(content)
        # without a stream the first token reaches the client with the whole answer
        await self._settle(ctx, instance.backend, result.get("usage") or {}, 0, ctx.elapsed_ms())
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
            raise self._timed_out(ctx) from None
        try:
            async with asyncio.timeout_at(deadline):
                with ctx.waiting_for_engine():
                    upstream = await instance.engine.client.request(
                        "POST", instance.engine.route(ctx.endpoint), payload, headers=_priority(ctx)
                    )
                    if upstream.status != 200:
                        raise EngineAnswerError(upstream.status, await upstream.read())
                    ctx.engine_took = True  # the engine has the prompt and started its answer
        except TimeoutError:
            await lease.__aexit__(None, None, None)
            raise self._timed_out(ctx) from None
        except EngineConnectionError:
            await lease.__aexit__(None, None, None)
            raise _engine_stopped(ctx.model) from None
        except BaseException as exc:
            await lease.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        events = self._relay(ctx, upstream, lease, instance, deadline)
        return Stream(events, media_type="text/event-stream", headers={**self._headers(ctx), "cache-control": "no-cache"})

    async def _relay(
        self,
        ctx: RequestContext,
        upstream: EngineResponse,
        lease: contextlib.AbstractAsyncContextManager[Instance],
        instance: Instance,
        deadline: float,
    ) -> AsyncIterator[bytes]:
        """Pass the engine's SSE events through; settle before the final [DONE].

        The ledger row carries the real outcome: 200 with the engine's usage; the
        engine's own error event mid-stream or a stopped engine → a 5xx row; the
        request deadline → 504; a client that left → 499. Each charges the tokens
        streamed so far and the prompt (see the module's docstring for when). A chat
        stream's opening role event carries no token: it is neither counted nor
        taken as the first token.
        """
        want_usage = _wants_usage(ctx.body)
        usage: JsonObject | None = None
        ttft_ms: float | None = None
        events = 0
        opening = ctx.endpoint == "chat"  # the next event may be the chat stream's role-only opening
        buffer = b""
        settled = False
        engine_failed = False
        collected: list[bytes] | None = [] if self.cache is not None else None
        chunks = upstream.iter_raw()
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):  # only the wait for the engine, never the client's reads
                        with ctx.waiting_for_engine():
                            chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                buffer += chunk
                if b"\n\n" not in buffer:
                    continue
                *complete, buffer = buffer.split(b"\n\n")
                out = []
                for event in complete:
                    if not event:
                        continue
                    if event == b"data: [DONE]":
                        continue
                    if b'"usage"' in event and b'"choices":[]' in event.replace(b" ", b""):
                        usage = json.loads(event[5:]).get("usage")
                        if not want_usage:
                            continue
                    elif b'"error"' in event and event.startswith(b'data: {"error"'):
                        engine_failed = True
                        out.append(event + b"\n\n")
                        continue
                    else:
                        if opening and role_only(event):  # opens the turn: no token yet
                            opening = False
                        else:
                            opening = False
                            events += 1
                            if ttft_ms is None:
                                ttft_ms = ctx.elapsed_ms()
                        if collected is not None:
                            collected.append(event)
                    out.append(event + b"\n\n")
                if out:
                    yield b"".join(out)
            usage = usage or {}
            if engine_failed:
                settled = True
                await self._fail(ctx, 500, events, prompt_read(ctx, usage, prefilled=events > 0))
                yield DONE
                return
            await self._settle(ctx, instance.backend, usage, events, ttft_ms)
            settled = True
            if collected is not None and self.cache is not None and not isinstance(ctx.body, EmbeddingRequest):
                self.cache.store_stream(ctx.principal, ctx.endpoint, ctx.model, ctx.body, collected, usage, ctx.headers)
            yield DONE
        except TimeoutError:
            settled = True
            await self._fail(ctx, 504, events, prompt_read(ctx, usage, prefilled=True))
            yield b"data: " + json.dumps(self._timed_out(ctx).envelope()).encode() + b"\n\n" + DONE
        except EngineConnectionError:
            error = error_envelope(
                f"The engine serving `{ctx.model}` stopped mid-stream.", "server_error", None, "engine_unavailable"
            )
            settled = True
            await self._fail(ctx, 503, events, prompt_read(ctx, usage, prefilled=events > 0))
            yield b"data: " + json.dumps(error).encode() + b"\n\n" + DONE
        finally:
            await upstream.aclose()
            await lease.__aexit__(None, None, None)
            if not settled:  # client went away: charge the prompt and what was produced, free the rest
                await self._fail(ctx, 499, events, prompt_read(ctx, usage, prefilled=True))

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
        await self._settle(ctx, None, usage, 0, ctx.elapsed_ms(), hit.tier)
        headers = self._headers(ctx, hit.tier)
        if hit.similarity is not None:
            headers["x-cache-similarity"] = f"{hit.similarity:.4f}"
        if ctx.stream:
            return Stream(hit.as_sse(_wants_usage(ctx.body)), media_type="text/event-stream", headers=headers)
        return Response(content=hit.body, media_type="application/json", headers=headers)


def _wants_usage(body: Body) -> bool:
    options = getattr(body, "stream_options", None)
    return bool(options and options.include_usage)
