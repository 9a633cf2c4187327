"""The request path: admit, cache, route, forward, settle (DESIGN: one pass).

The gateway never re-renders engine output. Streams are passed through as the
engine's SSE bytes; the only per-token work is finding event boundaries and
counting events, and only the final usage event is parsed. The usage row and
the quota settle are committed before the final ``data: [DONE]`` (or the last
byte of a plain response) is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import Any, AsyncIterator, Awaitable

import httpx
import msgspec
from litestar import Request, Response
from litestar.response import Stream

from appliance.api.access import principal_of
from appliance.accounts.keys import Principal
from appliance.errors import ApplianceError, EngineTimeout, EngineUnavailable, PermissionDenied
from appliance.api.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, prompt_text

log = logging.getLogger("appliance.serving.gateway")

ENGINE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
DEFAULT_MAX_TOKENS_ESTIMATE = 256
DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def _new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def _engine_stopped(name: str) -> EngineUnavailable:
    return EngineUnavailable(f"The engine serving `{name}` stopped; it is being restarted. Retry shortly.", headers={"Retry-After": "2"})


def estimate_tokens(body: Any) -> int:
    """Quota reservation of a request whose completion is not capped: prompt characters / 4 plus the completion budget."""
    prompt = len(prompt_text(body)) // 4 + 1
    if isinstance(body, EmbeddingRequest):
        return prompt
    return prompt + (requested_tokens(body) or DEFAULT_MAX_TOKENS_ESTIMATE)


# A prompt's tokens never outnumber its UTF-8 bytes (every non-special token of a
# byte-level or byte-fallback vocabulary covers at least one byte); the chat template
# adds its own markers and text, bounded here per message and per request.
PROMPT_OVERHEAD_TOKENS = 64
MESSAGE_OVERHEAD_TOKENS = 16


def prompt_bound(body: Any) -> int:
    """An upper bound of the prompt tokens a completion or chat request can be billed."""
    if isinstance(body, ChatCompletionRequest):
        size = 0
        for message in body.messages:
            size += MESSAGE_OVERHEAD_TOKENS + len(message.role) + len((message.name or "").encode())
            if message.content is not None:
                size += len(message.content.encode() if isinstance(message.content, str) else _encoder.encode(message.content))
            if message.tool_calls:
                size += len(_encoder.encode(message.tool_calls))
            size += len((message.tool_call_id or "").encode())
        if body.tools:
            size += len(_encoder.encode(body.tools))
        if body.response_format is not None:
            size += len(_encoder.encode(body.response_format))
        return size + PROMPT_OVERHEAD_TOKENS
    return len(prompt_text(body).encode()) + PROMPT_OVERHEAD_TOKENS


def requested_tokens(body: Any) -> int | None:
    """The completion tokens a request asks for (``None``: as many as the engine gives)."""
    return getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)


def with_cap(body: Any, cap: int | None) -> Any:
    """``body`` asking for at most ``cap`` completion tokens (unchanged if it already asks for no more)."""
    requested = requested_tokens(body)
    if cap is None or (requested is not None and requested <= cap):
        return body
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return msgspec.structs.replace(body, max_tokens=cap, max_completion_tokens=cap)
    return msgspec.structs.replace(body, max_tokens=cap)


class EngineError(ApplianceError):
    """An error the engine answered with, passed through with its status."""

    def __init__(self, status: int, body: bytes):
        try:
            error = json.loads(body)["error"]
            message, type_, param, code = error.get("message", ""), error.get("type", "invalid_request_error"), error.get("param"), error.get("code")
        except (ValueError, KeyError, TypeError):
            message, type_, param, code = body[:300].decode("utf-8", "replace") or "engine error", "server_error", None, None
        super().__init__(message, param=param, code=code)
        self.status = status
        self.type = type_


class ClientDisconnected(ApplianceError):
    """The client hung up before its answer was ready; the generation was cancelled."""

    status = 499  # nginx's "client closed request": only ever seen in the ledger
    type = "invalid_request_error"
    code = "client_disconnected"


async def _hang_up(request: Request) -> None:
    """Return when the client closes the connection (its body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response:
    """Await ``work``; if the client hangs up first, cancel it so the engine stops generating for nobody."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_hang_up(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # frees the lease and the engine connection
    if task.cancelled():
        raise ClientDisconnected("The client closed the connection before the answer was ready.")
    return task.result()


class Gateway:
    def __init__(self, settings: Any, router: Any, meter: Any, cache: Any = None, metrics: Any = None, energy: Any = None):
        self.settings = settings
        self.router = router
        self.meter = meter
        self.cache = cache
        self.metrics = metrics
        self.energy = energy

    # ------------------------------------------------------------------ entry
    async def handle(self, request: Request, endpoint: str, body: Any) -> Response:
        principal: Principal = principal_of(request)
        name = self.router.resolve(body.model)
        if not principal.may_use(name):
            raise PermissionDenied(f"This key may not use the model `{body.model}`.", param="model", code="model_not_allowed")
        request_id = _new_request_id()
        started = time.perf_counter()
        stream = bool(getattr(body, "stream", False))

        if self.cache is not None and endpoint != "embeddings":
            hit = await self.cache.lookup_async(principal, endpoint, name, body, request.headers)
            if hit is not None:
                return await self._serve_cached(principal, request_id, endpoint, name, body, hit, started, stream)

        if endpoint == "embeddings":
            admission = self.meter.admit(principal, request_id=request_id, endpoint=endpoint, model=name, estimated_tokens=estimate_tokens(body))
        else:
            # reserve the prompt, then cap the completion to what the key's and team's budgets have left
            admission = self.meter.admit(principal, request_id=request_id, endpoint=endpoint, model=name,
                                         estimated_tokens=prompt_bound(body), cap=True,
                                         max_tokens=requested_tokens(body) or self._context(name))
            body = with_cap(body, admission.max_tokens)
        forward = msgspec.structs.replace(body, model=name)
        if stream:
            forward = msgspec.structs.replace(forward, stream_options={"include_usage": True})  # type: ignore[arg-type]
        payload = _encoder.encode(forward)
        mark = self.energy.begin() if self.energy is not None else None
        try:
            if stream:
                return await self._stream(principal, admission, request_id, endpoint, name, body, payload, started, request.headers, mark)
            return await _unless_client_leaves(
                request, self._plain(principal, admission, request_id, endpoint, name, body, payload, started, request.headers, mark))
        except BaseException as exc:
            await self._fail(admission, name, exc.status if isinstance(exc, ApplianceError) else 499, 0, started, mark)
            raise

    def _context(self, name: str) -> int | None:
        """The loaded model's context, the most a request without max_tokens can generate (None if unknown)."""
        instance = getattr(self.router, "instances", {}).get(name)
        context = getattr(getattr(instance, "plan", None), "context", None)
        return context if isinstance(context, int) and context > 0 else None

    # ------------------------------------------------------------ accounting
    def _energy(self, mark: Any) -> float | None:
        return self.energy.end(mark) if mark is not None and self.energy is not None else None

    async def _settle(self, admission: Any, name: str, backend: str | None, usage: dict, completion_default: int,
                      ttft_ms: float | None, started: float, mark: Any, tier: str = "miss") -> None:
        """Write the usage row and settle quotas (durable before returning), then count the request."""
        latency_ms = (time.perf_counter() - started) * 1000
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or completion_default)
        cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        energy = self._energy(mark)
        await self.meter.settle(
            admission, model=name, variant=name.split(":", 1)[-1], backend=backend, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, cached_tokens=cached_tokens, ttft_ms=ttft_ms, latency_ms=latency_ms,
            status=200, cache_tier=tier, energy_joules=energy,
        )
        if self.metrics is not None:
            self.metrics.observe_request(name, 200, ttft_ms, latency_ms, prompt_tokens, completion_tokens, tier, energy)

    async def _fail(self, admission: Any, name: str, status: int, completion_tokens: int, started: float, mark: Any) -> None:
        """Record what a failed or abandoned request produced and free its reservation."""
        energy = self._energy(mark)
        await self.meter.release(admission, status=status, model=name, completion_tokens=completion_tokens)
        if self.metrics is not None:
            latency_ms = (time.perf_counter() - started) * 1000
            self.metrics.observe_request(name, status, None, latency_ms, 0, completion_tokens, "miss", energy)

    # ------------------------------------------------------------- plain call
    async def _plain(self, principal: Principal, admission: Any, request_id: str, endpoint: str, name: str, body: Any,
                     payload: bytes, started: float, headers: Any, mark: Any) -> Response:
        async with self.router.lease(name, principal.priority) as instance:
            try:
                response = await instance.engine.client.post(ENGINE_PATHS[endpoint], content=payload, headers={"content-type": "application/json"})
            except httpx.TimeoutException:
                raise EngineTimeout(f"The model `{name}` did not answer within {self.settings.request_timeout_seconds:.0f} s.") from None
            except httpx.TransportError:
                raise _engine_stopped(name) from None
        if response.status_code != 200:
            raise EngineError(response.status_code, response.content)
        content = response.content
        result = json.loads(content)
        await self._settle(admission, name, instance.backend, result.get("usage") or {}, 0, None, started, mark)
        if self.cache is not None and endpoint != "embeddings":
            self.cache.store(principal, endpoint, name, body, result, headers)
        return Response(content=content, media_type="application/json", headers={**admission.headers, "x-cache": "miss", "x-request-id": request_id})

    # ---------------------------------------------------------------- streams
    async def _stream(self, principal: Principal, admission: Any, request_id: str, endpoint: str, name: str, body: Any,
                      payload: bytes, started: float, headers: Any, mark: Any) -> Response:
        lease = self.router.lease(name, principal.priority)
        instance = await lease.__aenter__()
        try:
            client: httpx.AsyncClient = instance.engine.client
            upstream = await client.send(
                client.build_request("POST", ENGINE_PATHS[endpoint], content=payload, headers={"content-type": "application/json"}),
                stream=True,
            )
            if upstream.status_code != 200:
                content = await upstream.aread()
                await upstream.aclose()
                raise EngineError(upstream.status_code, content)
        except httpx.TransportError:
            await lease.__aexit__(None, None, None)
            raise _engine_stopped(name) from None
        except BaseException as exc:
            await lease.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        want_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = self._relay(upstream, lease, instance, admission, name, started, want_usage, principal, endpoint, body, headers, mark)
        return Stream(events, media_type="text/event-stream",
                      headers={**admission.headers, "x-cache": "miss", "x-request-id": request_id, "cache-control": "no-cache"})

    async def _relay(self, upstream: httpx.Response, lease: Any, instance: Any, admission: Any, name: str, started: float,
                     want_usage: bool, principal: Principal, endpoint: str, body: Any, headers: Any, mark: Any) -> AsyncIterator[bytes]:
        """Pass the engine's SSE events through; settle before the final [DONE]."""
        usage: dict | None = None
        ttft_ms: float | None = None
        events = 0
        buffer = b""
        settled = False
        collected: list[bytes] | None = [] if self.cache is not None else None
        try:
            async for chunk in upstream.aiter_raw():
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
                        out.append(event + b"\n\n")
                        continue
                    else:
                        events += 1
                        if ttft_ms is None:
                            ttft_ms = (time.perf_counter() - started) * 1000
                        if collected is not None:
                            collected.append(event)
                    out.append(event + b"\n\n")
                if out:
                    yield b"".join(out)
            usage = usage or {}
            await self._settle(admission, name, instance.backend, usage, events, ttft_ms, started, mark)
            settled = True
            if collected is not None and self.cache is not None:
                self.cache.store_stream(principal, endpoint, name, body, collected, usage, headers)
            yield DONE
        except httpx.TransportError:
            error = {"error": {"message": f"The engine serving `{name}` stopped mid-stream.", "type": "server_error", "param": None, "code": "engine_unavailable"}}
            settled = True
            await self._fail(admission, name, 503, events, started, mark)
            yield b"data: " + json.dumps(error).encode() + b"\n\n" + DONE
        finally:
            await upstream.aclose()
            await lease.__aexit__(None, None, None)
            if not settled:  # client went away: record what was produced, free the reservation
                await self._fail(admission, name, 499, events, started, mark)

    # ------------------------------------------------------------------ cache
    async def _serve_cached(self, principal: Principal, request_id: str, endpoint: str, name: str, body: Any, hit: Any,
                            started: float, stream: bool) -> Response:
        admission = self.meter.admit(principal, request_id=request_id, endpoint=endpoint, model=name,
                                     estimated_tokens=hit.prompt_tokens + hit.completion_tokens, cached=True)
        usage = {"prompt_tokens": hit.prompt_tokens, "completion_tokens": hit.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": hit.prompt_tokens}}
        await self._settle(admission, name, None, usage, 0, (time.perf_counter() - started) * 1000, started, None, hit.tier)
        headers = {**admission.headers, "x-cache": hit.tier, "x-request-id": request_id}
        if hit.similarity is not None:
            headers["x-cache-similarity"] = f"{hit.similarity:.4f}"
        if stream:
            want_usage = bool(body.stream_options and body.stream_options.include_usage)
            return Stream(hit.as_sse(want_usage), media_type="text/event-stream", headers=headers)
        return Response(content=hit.body, media_type="application/json", headers=headers)
