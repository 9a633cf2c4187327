"""OpenAI's Batch API under /v1/batches. Handlers are thin: the batch store keeps batches, the runner runs them."""

from __future__ import annotations

import asyncio

from litestar import Controller, get, post

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.batch.objects import batch_object, batch_objects, list_page
from appliance.batch.runner import BatchRunner
from appliance.batch.store import BatchStore, check_metadata
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject


class BatchesController(Controller):
    path = "/v1/batches"
    opt = requires(Access.KEY)
    tags = ["OpenAI-compatible API"]

    @post("/", summary="Create a batch from an uploaded input file", status_code=200)
    async def create(
        self, data: JsonObject, batch_store: BatchStore, batch_runner: BatchRunner, principal: Principal
    ) -> JsonObject:
        input_file_id, endpoint = data.get("input_file_id"), data.get("endpoint")
        if not isinstance(input_file_id, str) or not isinstance(endpoint, str):
            raise BadRequest("`input_file_id` and `endpoint` are required strings.", param="input_file_id")
        window = data.get("completion_window", "24h")
        metadata = check_metadata(data.get("metadata"))
        row = await asyncio.to_thread(batch_store.create, principal, input_file_id, endpoint, str(window), metadata)
        batch_runner.wake()
        return batch_object(row, (0, 0))

    @get("/", summary="List the caller's batches, newest first")
    async def list_batches(
        self, batch_store: BatchStore, principal: Principal, after: str | None = None, limit: int = 20
    ) -> JsonObject:
        rows, more = await asyncio.to_thread(batch_store.list, principal, after, max(1, min(limit, 100)))
        data = await asyncio.to_thread(batch_objects, batch_store, rows)
        return list_page(data, more)

    @get("/{batch_id:str}", summary="Get a batch (the creating key and admins only)")
    async def retrieve(self, batch_id: str, batch_store: BatchStore, principal: Principal) -> JsonObject:
        row = await asyncio.to_thread(batch_store.get, principal, batch_id)
        return (await asyncio.to_thread(batch_objects, batch_store, [row]))[0]

    @post("/{batch_id:str}/cancel", summary="Cancel a batch: lines in flight finish, no more start", status_code=200)
    async def cancel(self, batch_id: str, batch_store: BatchStore, batch_runner: BatchRunner, principal: Principal) -> JsonObject:
        row = await asyncio.to_thread(batch_store.cancel, principal, batch_id)
        batch_runner.wake()
        return (await asyncio.to_thread(batch_objects, batch_store, [row]))[0]
