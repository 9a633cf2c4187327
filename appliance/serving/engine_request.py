"""What the gateway sends the engine for one request: the completion cap, the latency class and the encoded body."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from appliance.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, for_engine
from appliance.serving.context import Body, RequestContext
from appliance.serving.engine_client import PRIORITY_HEADER

_encoder = msgspec.json.Encoder()


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


def wants_usage(body: Body) -> bool:
    """Whether the client asked for the stream's usage event (``stream_options.include_usage``)."""
    options = getattr(body, "stream_options", None)
    return bool(options and options.include_usage)


def priority_headers(ctx: RequestContext) -> dict[str, str]:
    """The header telling the engine which latency class the request is in (its key's priority; batch lines: ``batch``)."""
    return {PRIORITY_HEADER: ctx.principal.priority}


def engine_payload(ctx: RequestContext) -> bytes:
    """The request's body as the engine reads it; a stream always asks for the usage event, which the meter needs."""
    forward = for_engine(ctx.body, model=ctx.model)
    if ctx.stream:
        forward = msgspec.structs.replace(forward, stream_options={"include_usage": True})
    return _encoder.encode(forward)
