"""The Anthropic Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A message is served as the chat completion it translates to
(:mod:`appliance.serving.anthropic`), through the gateway like every other
request: the same key, admission, cache, routing and metering; the ledger
names its endpoint ``messages``. Errors on these routes take Anthropic's shape
(the one handler, :mod:`appliance.api.errors`, reads the routes' ``opt``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from litestar import Controller, Request, Response, post
from litestar.response import Stream

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.api.errors import anthropic_errors
from appliance.api.request import stream_source
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.serving.anthropic.request import chat_request
from appliance.serving.anthropic.response import message
from appliance.serving.anthropic.schema import CountTokensRequest, MessagesRequest
from appliance.serving.anthropic.stream import StreamTranslator
from appliance.serving.gateway import Gateway

#: The ledger's name for the endpoint (the engine serves it as a chat completion).
LEDGER_ENDPOINT = "messages"


async def _events(chat: AsyncGenerator[bytes | str, None], translator: StreamTranslator) -> AsyncIterator[bytes]:
    """The chat stream's bytes, translated; closing this closes the chat stream (which settles the request)."""
    async with contextlib.aclosing(chat):
        async for chunk in chat:
            out = translator.feed(chunk.encode() if isinstance(chunk, str) else chunk)
            if out:
                yield out


class AnthropicController(Controller):
    path = "/v1/messages"
    opt = {**requires(Access.KEY), **anthropic_errors()}
    tags = ["Anthropic-compatible API"]

    @post("/", summary="Create a message", status_code=200)
    async def create_message(self, request: Request, data: MessagesRequest, gateway: Gateway, principal: Principal) -> Response:
        response = await gateway.handle(request, principal, "chat", chat_request(data), ledger_endpoint=LEDGER_ENDPOINT)
        if isinstance(response, Stream):
            translator = StreamTranslator(data.model, data.stop_sequences)
            return Stream(
                _events(stream_source(response), translator),
                media_type="text/event-stream",
                headers=dict(response.headers),
            )
        return Response(
            content=message(msgspec.json.decode(response.content), data.stop_sequences), headers=dict(response.headers)
        )

    @post("/count_tokens", summary="Count a message's input tokens", status_code=200)
    async def count_tokens(self, data: CountTokensRequest, gateway: Gateway, principal: Principal) -> JsonObject:
        counted = await gateway.prompt_tokens(principal, "chat", chat_request(data))
        if counted is None:
            raise BadRequest(
                f"The model `{data.model}` cannot count prompt tokens in the gateway (only GGUF models can).", param="model"
            )
        return {"input_tokens": counted}
