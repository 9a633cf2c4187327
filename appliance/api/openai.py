"""The OpenAI-compatible routes under /v1. Handlers are thin: the gateway does the work."""

from __future__ import annotations

import msgspec
from litestar import Controller, Request, Response, get, post

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, NamedToolChoice
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
                data.append({"id": entry["id"], "object": "model", "created": int(entry["created"]), "owned_by": "appliance"})
        return {"object": "list", "data": data}

    @post("/chat/completions", summary="Create chat completion", status_code=200)
    async def chat_completions(self, request: Request, data: ChatCompletionRequest, gateway: Gateway, principal: Principal) -> Response:
        check_tool_choice(data)
        if data.tool_choice == "none":
            data = msgspec.structs.replace(data, tools=None, tool_choice=None)  # the model is not offered the tools
        elif data.tool_choice == "auto":
            data = msgspec.structs.replace(data, tool_choice=None)  # what the engines do with tools and no tool_choice
        return await gateway.handle(request, principal, "chat", data)

    @post("/completions", summary="Create completion", status_code=200)
    async def completions(self, request: Request, data: CompletionRequest, gateway: Gateway, principal: Principal) -> Response:
        return await gateway.handle(request, principal, "completions", data)

    @post("/embeddings", summary="Create embeddings", status_code=200)
    async def embeddings(self, request: Request, data: EmbeddingRequest, gateway: Gateway, principal: Principal) -> Response:
        return await gateway.handle(request, principal, "embeddings", data)


def check_tool_choice(data: ChatCompletionRequest) -> None:
    """A forced ``tool_choice`` needs the tools it names, and no ``response_format`` (one grammar per answer)."""
    choice = data.tool_choice
    if choice is None or choice in ("auto", "none"):
        return
    functions = [t.get("function") for t in data.tools or []]
    names = {f["name"] for f in functions if isinstance(f, dict) and isinstance(f.get("name"), str)}
    if not names:
        raise BadRequest("tool_choice \"required\" or a named function needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise BadRequest(f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                         param="tool_choice")
    if data.response_format is not None and data.response_format.type != "text":
        raise BadRequest("a forced tool_choice cannot be combined with response_format", param="tool_choice")
