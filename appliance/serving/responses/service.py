"""One /v1/responses request: read the conversation, ask the gateway for a chat completion, answer as a response.

The chat request goes through :meth:`Gateway.handle` like any other, so the
key's model allow-list, quotas, the cache, metering and the request deadline
apply unchanged. A response is stored (unless ``store: false``) before its last
byte is sent: once a client has seen ``response.completed``, a follow-up with
its ``previous_response_id`` finds it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator

from litestar import Request, Response
from litestar.response import Stream

from appliance.accounts.keys import Principal
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ResponsesRequest
from appliance.serving.gateway import Gateway
from appliance.serving.responses.events import StreamTranslator, sse
from appliance.serving.responses.stored import ResponseStore
from appliance.serving.responses.translate import ResponseHead, chat_request, completed_response, input_items, new_id


class ResponsesService:
    def __init__(self, gateway: Gateway, store: ResponseStore):
        self.gateway = gateway
        self.store = store

    async def create(self, request: Request, principal: Principal, body: ResponsesRequest) -> Response:
        items = input_items(body.input)
        if body.previous_response_id is not None:
            previous = await self.store.load_async(principal, body.previous_response_id)
            items = previous.continued() + items
        chat = chat_request(body, items)
        head = ResponseHead.of(body, new_id("resp"), int(time.time()))
        answer = await self.gateway.handle(request, principal, "chat", chat)
        keep = body.store is not False
        if isinstance(answer, Stream):
            events = self._stream(answer.iterator, StreamTranslator(head), principal, items if keep else None)  # type: ignore[arg-type]
            return Stream(events, media_type="text/event-stream", headers={**dict(answer.headers), "cache-control": "no-cache"})
        response = completed_response(head, json.loads(answer.content))
        if keep:
            await self.store.save_async(principal, items, response)
        return Response(content=response, headers=dict(answer.headers))

    async def _stream(
        self, upstream: AsyncIterator[bytes], translator: StreamTranslator, principal: Principal, keep: list[JsonObject] | None
    ) -> AsyncIterator[bytes]:
        """The Responses events for the gateway's chat stream; closing this closes the gateway's stream (and settles it)."""
        async with contextlib.aclosing(upstream):  # type: ignore[type-var]
            yield b"".join(sse(event) for event in translator.start())
            buffer = b""
            async for chunk in upstream:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n\n")
                out = []
                for event in complete:
                    # after a failure the gateway's stream is read to its end, so it records the failure as it happened
                    if translator.failed or not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    out += translator.feed(json.loads(event[6:]))
                if out:
                    yield b"".join(sse(event) for event in out)
            if translator.failed:
                return
            last = translator.finish()
            if keep is not None and translator.final is not None:
                await self.store.save_async(principal, keep, translator.final)
            yield b"".join(sse(event) for event in last)
