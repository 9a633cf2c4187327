"""OpenAI's Responses API under /v1/responses. Handlers are thin: the responses service does the work."""

from __future__ import annotations

from litestar import Controller, Request, Response, delete, get, post

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ResponsesRequest
from appliance.serving.responses.service import ResponsesService
from appliance.serving.responses.stored import ResponseStore


class ResponsesController(Controller):
    path = "/v1/responses"
    opt = requires(Access.KEY)
    tags = ["OpenAI-compatible API"]

    @post("/", summary="Create a response (text and function calls; streamed with stream=true)", status_code=200)
    async def create(
        self,
        request: Request,
        data: ResponsesRequest,
        responses: ResponsesService,
        principal: Principal,
    ) -> Response:
        return await responses.create(request, principal, data)

    @get("/{response_id:str}", summary="Get a stored response (the creating key only)")
    async def retrieve(self, response_id: str, response_store: ResponseStore, principal: Principal) -> JsonObject:
        return (await response_store.load_async(principal, response_id)).response

    @get("/{response_id:str}/input_items", summary="List the input items a stored response answered")
    async def input_items(self, response_id: str, response_store: ResponseStore, principal: Principal) -> JsonObject:
        items = (await response_store.load_async(principal, response_id)).items
        data = [{"id": f"{response_id}_in_{index}", **item} for index, item in enumerate(items)]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }

    @delete("/{response_id:str}", summary="Delete a stored response (the creating key only)", status_code=200)
    async def remove(self, response_id: str, response_store: ResponseStore, principal: Principal) -> JsonObject:
        await response_store.delete_async(principal, response_id)
        return {"id": response_id, "object": "response", "deleted": True}
