"""A stream's relay: the engine's SSE events passed through to the client, settled before the final ``data: [DONE]``.

The relay never re-renders engine output: the only per-token work is finding event boundaries and counting events,
and only the final usage event is parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from appliance.cache.responses import ResponseCache
from appliance.errors import error_envelope
from appliance.jsontypes import JsonObject
from appliance.openai_schema import EmbeddingRequest
from appliance.serving.books import RequestBooks
from appliance.serving.context import RequestContext
from appliance.serving.early_end import prompt_read, role_only
from appliance.serving.engine_client import EngineConnectionError, EngineResponse
from appliance.serving.engine_errors import timed_out
from appliance.serving.engine_request import wants_usage
from appliance.serving.router import Instance

DONE = b"data: [DONE]\n\n"


async def relay(
    ctx: RequestContext,
    upstream: EngineResponse,
    lease: contextlib.AbstractAsyncContextManager[Instance],
    instance: Instance,
    deadline: float,
    *,
    books: RequestBooks,
    cache: ResponseCache | None,
    timeout_seconds: float,
) -> AsyncIterator[bytes]:
    """Pass the engine's SSE events through; settle before the final [DONE].

    The ledger row carries the real outcome: 200 with the engine's usage; the
    engine's own error event mid-stream or a stopped engine → a 5xx row; the
    request deadline → 504; a client that left → 499. Each charges the tokens
    streamed so far and the prompt (:mod:`appliance.serving.early_end` says when).
    A chat stream's opening role event carries no token: it is neither counted
    nor taken as the first token. The lease is given back when the stream ends.
    """
    want_usage = wants_usage(ctx.body)
    usage: JsonObject | None = None
    ttft_ms: float | None = None
    events = 0
    opening = ctx.endpoint == "chat"  # the next event may be the chat stream's role-only opening
    buffer = b""
    settled = False
    engine_failed = False
    collected: list[bytes] | None = [] if cache is not None else None
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
            await books.fail(ctx, 500, events, prompt_read(ctx, usage, prefilled=events > 0))
            yield DONE
            return
        await books.settle(ctx, instance.backend, usage, events, ttft_ms)
        settled = True
        if collected is not None and cache is not None and not isinstance(ctx.body, EmbeddingRequest):
            cache.store_stream(ctx.principal, ctx.endpoint, ctx.model, ctx.body, collected, usage, ctx.headers)
        yield DONE
    except TimeoutError:
        settled = True
        await books.fail(ctx, 504, events, prompt_read(ctx, usage, prefilled=True))
        yield b"data: " + json.dumps(timed_out(ctx.model, timeout_seconds).envelope()).encode() + b"\n\n" + DONE
    except EngineConnectionError:
        error = error_envelope(
            f"The engine serving `{ctx.model}` stopped mid-stream.", "server_error", None, "engine_unavailable"
        )
        settled = True
        await books.fail(ctx, 503, events, prompt_read(ctx, usage, prefilled=events > 0))
        yield b"data: " + json.dumps(error).encode() + b"\n\n" + DONE
    finally:
        await upstream.aclose()
        await lease.__aexit__(None, None, None)
        if not settled:  # client went away: charge the prompt and what was produced, free the rest
            await books.fail(ctx, 499, events, prompt_read(ctx, usage, prefilled=True))
