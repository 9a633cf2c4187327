"""The OpenAI-compatible routes under /v1. Handlers are thin: the gateway does the work.

The inference handlers take one dependency (the gateway) and read the caller the access guard
authenticated from the request: with two, Litestar resolves them concurrently in a task group on
every request, which cost more than the rest of the route's plumbing.
"""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post

from appliance.accounts.keys import Principal
from appliance.api.access import Access, principal_of, requires
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from appliance.serving.gateway import Gateway
from appliance.serving.names import ModelNames


class OpenAIController(Controller):
    path = "/v1"
    opt = requires(Access.KEY)
    tags = ["OpenAI-compatible API"]

    @get("/models", summary="List models")
    async def list_models(self, principal: Principal, names: ModelNames) -> JsonObject:
        data = []
        for entry in names.listing():
            if principal.may_use(entry["id"]) or entry.get("target") and principal.may_use(entry["target"]):
                data.append(
                    {
                        "id": entry["id"],
                        "object": "model",
                        "created": int(entry["created"]),
                        "owned_by": "appliance",
                        "capabilities": entry["capabilities"],
                    }
                )
        return {"object": "list", "data": data}

    @post("/chat/completions", summary="Create chat completion", status_code=200)
    async def chat_completions(self, request: Request, data: ChatCompletionRequest, gateway: Gateway) -> Response:
        return await gateway.handle(request, principal_of(request), "chat", data)

    @post("/completions", summary="Create completion", status_code=200)
    async def completions(self, request: Request, data: CompletionRequest, gateway: Gateway) -> Response:
        return await gateway.handle(request, principal_of(request), "completions", data)

    @post("/embeddings", summary="Create embeddings", status_code=200)
    async def embeddings(self, request: Request, data: EmbeddingRequest, gateway: Gateway) -> Response:
        return await gateway.handle(request, principal_of(request), "embeddings", data)
