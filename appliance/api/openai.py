"""The OpenAI-compatible routes under /v1. Handlers are thin: the gateway does the work."""

from __future__ import annotations

import time

import msgspec
from litestar import Controller, Request, Response, get, post

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import (ChatCompletionRequest, ChatMessage, CompletionRequest, EmbeddingRequest, NamedToolChoice,
                                     ResponsesRequest)
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

    @post("/responses", summary="Create a response (plain text input and output)", status_code=200)
    async def responses(self, request: Request, data: ResponsesRequest, gateway: Gateway, principal: Principal) -> Response:
        if data.stream:
            raise BadRequest("Streaming is not supported on /v1/responses; use /v1/chat/completions with stream=true.", param="stream")
        messages = []
        if data.instructions:
            messages.append(ChatMessage(role="system", content=data.instructions))
        if isinstance(data.input, str):
            messages.append(ChatMessage(role="user", content=data.input))
        else:
            for item in data.input:
                try:
                    messages.append(msgspec.convert(item, ChatMessage))
                except msgspec.ValidationError as exc:
                    raise BadRequest(f"input items must be role/content messages: {exc}", param="input") from None
        chat = ChatCompletionRequest(model=data.model, messages=messages, max_tokens=data.max_output_tokens,
                                     temperature=data.temperature, top_p=data.top_p, user=data.user)
        response = await gateway.handle(request, principal, "chat", chat)
        result = msgspec.json.decode(response.content)
        text = result["choices"][0]["message"].get("content") or ""
        usage = result.get("usage") or {}
        body = {
            "id": "resp_" + result.get("id", "").removeprefix("chatcmpl-"),
            "object": "response",
            "created_at": result.get("created", int(time.time())),
            "status": "completed",
            "model": result.get("model", data.model),
            "output": [{
                "type": "message", "id": "msg_" + result.get("id", ""), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }],
            "output_text": text,
            "usage": {
                "input_tokens": usage.get("prompt_tokens", 0),
                "input_tokens_details": {"cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)},
                "output_tokens": usage.get("completion_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
            },
        }
        return Response(content=body, headers=dict(response.headers))


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
