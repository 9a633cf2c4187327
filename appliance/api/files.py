"""OpenAI's Files API under /v1/files, for batch inputs and outputs. Handlers are thin: the file store does the work.

An upload's size is checked on its Content-Length before the body is read (413 past ``files_max_bytes``); its lines
are checked before anything is kept (400 naming the lines).
"""

from __future__ import annotations

import asyncio

from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import UploadFile

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.batch.files import FileStore
from appliance.batch.objects import file_object, list_page
from appliance.errors import BadRequest, PayloadTooLarge
from appliance.jsontypes import JsonObject
from appliance.settings import Settings

MULTIPART_OVERHEAD = 64 * 1024  # the form's boundaries, headers and `purpose` field around the file


class FilesController(Controller):
    path = "/v1/files"
    opt = requires(Access.KEY)
    tags = ["OpenAI-compatible API"]

    @post(
        "/", summary="Upload a batch input file (multipart: `file`, `purpose`=batch)", status_code=200, request_max_body_size=None
    )
    async def upload(self, request: Request, files: FileStore, settings: Settings, principal: Principal) -> JsonObject:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            raise BadRequest("An upload needs a Content-Length header.", param="file")
        if int(length) > settings.files_max_bytes + MULTIPART_OVERHEAD:
            raise PayloadTooLarge(f"The upload is larger than files_max_bytes ({settings.files_max_bytes} bytes).", param="file")
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise BadRequest("The form has no `file` part.", param="file")
        purpose = form.get("purpose")
        content = await upload.read()
        row, _ = await asyncio.to_thread(
            files.upload, principal, upload.filename or "", purpose if isinstance(purpose, str) else "", content
        )
        return file_object(row)

    @get("/", summary="List the caller's files")
    async def list_files(
        self, files: FileStore, principal: Principal, purpose: str | None = None, after: str | None = None, limit: int = 100
    ) -> JsonObject:
        rows, more = await asyncio.to_thread(files.list, principal, purpose, after, max(1, min(limit, 10_000)))
        data = [file_object(r) for r in rows]
        return list_page(data, more)

    @get("/{file_id:str}", summary="Get a file's description (the owning key and admins only)")
    async def retrieve(self, file_id: str, files: FileStore, principal: Principal) -> JsonObject:
        return file_object(await asyncio.to_thread(files.get, principal, file_id))

    @get("/{file_id:str}/content", summary="Download a file's content (JSONL)")
    async def content(self, file_id: str, files: FileStore, principal: Principal) -> Response:
        body = await asyncio.to_thread(files.content, principal, file_id)
        return Response(content=body, media_type="application/jsonl")

    @delete("/{file_id:str}", summary="Delete a file", status_code=200)
    async def remove(self, file_id: str, files: FileStore, principal: Principal) -> JsonObject:
        await asyncio.to_thread(files.delete, principal, file_id)
        return {"id": file_id, "object": "file", "deleted": True}
