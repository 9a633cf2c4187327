"""The Ollama API under /api: translated to the internal requests and served by the one gateway.

Chat, generate and embed requests become OpenAI-shaped bodies
(:mod:`appliance.serving.ollama.to_openai`) and go through
:meth:`Gateway.handle`, so they are authenticated, admitted, cached, routed
and metered exactly as ``/v1`` requests are; the answer is rewritten into
Ollama's objects (:mod:`~appliance.serving.ollama.answers`), streamed as NDJSON by default
(:mod:`~appliance.serving.ollama.streams`). Pulls and deletes are the
store's own, for admin keys only. Errors come out as ``{"error": "..."}``
(the one handler, :mod:`appliance.api.errors`, keys on the path family).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.response import Stream

from appliance.accounts.keys import Principal
from appliance.api.access import Access, requires
from appliance.api.errors import ollama_errors
from appliance.api.models import CHANGES, StoreChanges
from appliance.api.request import stream_source
from appliance.errors import ApplianceError, BadRequest, PermissionDenied
from appliance.jsontypes import JsonObject
from appliance.serving.gateway import Gateway
from appliance.serving.names import ModelNames
from appliance.serving.ollama import answers, streams, to_openai, views
from appliance.serving.ollama.schema import (
    ChatRequest,
    DeleteRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    PullRequest,
    ShowRequest,
)
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore

NDJSON = "application/x-ndjson"
_encoder = msgspec.json.Encoder()


def _line(obj: JsonObject) -> bytes:
    return _encoder.encode(obj) + b"\n"


async def ndjson(sse: AsyncIterable[bytes | str], translator: streams.StreamTranslator) -> AsyncIterator[bytes]:
    """The gateway's SSE stream as Ollama's NDJSON: one object per line, the last with ``done: true``.

    If the client leaves, the gateway's stream is closed at once (not when it is collected), so
    the engine stops and the request is settled with what it produced.
    """
    buffer = b""
    try:
        async for chunk in sse:
            buffer += chunk.encode() if isinstance(chunk, str) else chunk
            *events, buffer = buffer.split(b"\n\n")
            lines = [_line(obj) for event in events if event for obj in translator.event(event, time.perf_counter_ns())]
            if lines:
                yield b"".join(lines)
        lines = [_line(obj) for obj in translator.finish(time.perf_counter_ns())]
        if lines:
            yield b"".join(lines)
    finally:
        close = getattr(sse, "aclose", None)
        if close is not None:
            await close()


def _timings(started_ns: int) -> answers.Timings:
    # a plain answer arrives whole: the prompt and the generation are not timed apart
    total = time.perf_counter_ns() - started_ns
    return answers.Timings(total=total, prompt=0, generation=total)


def _plain(response: Response) -> JsonObject:
    return msgspec.json.decode(response.content)


def _passed_headers(response: Response) -> dict[str, str]:
    return {k: v for k, v in dict(response.headers).items() if k.lower() != "content-type"}


class JobFailed(ApplianceError):
    """A pull that ended without installing the model, with the status its error carried."""

    def __init__(self, error: JsonObject | None):
        error = error or {}
        super().__init__(str(error.get("message") or "the pull did not finish"), code=error.get("code"))
        self.status = int(error.get("status") or 500)


class OllamaController(Controller):
    path = "/api"
    opt = {**requires(Access.KEY), **ollama_errors()}
    tags = ["Ollama-compatible API"]

    @get("/version", summary="Ollama API version")
    async def version(self) -> JsonObject:
        return {"version": views.OLLAMA_API_VERSION}

    @get("/tags", summary="List models", sync_to_thread=True)
    def list_models(self, principal: Principal, store: ModelStore, names: ModelNames) -> JsonObject:
        ready = {info.name: info for info in store.list() if info.status == "ready"}
        models = [views.tag_entry(name, info) for name, info in ready.items() if principal.may_use(name)]
        for alias, target in names.aliases().items():
            info = ready.get(target) or next((i for i in ready.values() if i.family == target and i.is_default), None)
            if info is not None and (principal.may_use(alias) or principal.may_use(info.name)):
                models.append(views.tag_entry(alias, info))
        return {"models": models}

    @get("/ps", summary="List loaded models", sync_to_thread=True)
    def running(self, principal: Principal, store: ModelStore, router: Router, settings: Settings) -> JsonObject:
        now, clock = time.time(), time.monotonic()
        models = [
            views.ps_entry(
                store.get(instance.name),
                instance.plan,
                last_used_ago=clock - instance.last_used,
                idle_unload_seconds=settings.idle_unload_seconds,
                pinned=instance.pinned,
                now=now,
            )
            for instance in list(router.instances.values())
            if principal.may_use(instance.name)
        ]
        return {"models": models}

    @post("/show", summary="Show a model", status_code=200, sync_to_thread=True)
    def show(self, data: ShowRequest, principal: Principal, names: ModelNames) -> JsonObject:
        name = data.model or data.name
        if not name:
            raise BadRequest("model is required", param="model")
        target = names.resolve(name)
        if not principal.may_use(target.name):
            raise PermissionDenied(f"This key may not use the model `{name}`.", param="model", code="model_not_allowed")
        return views.show(target)

    @post("/chat", summary="Chat (NDJSON stream unless stream is false)", status_code=200)
    async def chat(
        self, request: Request, data: ChatRequest, gateway: Gateway, principal: Principal, names: ModelNames
    ) -> Response:
        started = time.perf_counter_ns()
        if not data.messages:
            return self._loaded(data.model, principal, names, started, chat=True)
        response = await gateway.handle(request, principal, "chat", to_openai.chat_request(data))
        if isinstance(response, Stream):
            return self._stream(response, streams.StreamTranslator(data.model, chat=True, started_ns=started))
        return Response(
            content=answers.chat_answer(_plain(response), data.model, _timings(started)), headers=_passed_headers(response)
        )

    @post("/generate", summary="Generate (NDJSON stream unless stream is false)", status_code=200)
    async def generate(
        self, request: Request, data: GenerateRequest, gateway: Gateway, principal: Principal, names: ModelNames
    ) -> Response:
        started = time.perf_counter_ns()
        body = to_openai.generate_request(data)
        if not data.prompt:
            return self._loaded(data.model, principal, names, started, chat=False)
        endpoint = "completions" if data.raw else "chat"
        response = await gateway.handle(request, principal, endpoint, body)
        if isinstance(response, Stream):
            return self._stream(response, streams.StreamTranslator(data.model, chat=False, started_ns=started))
        return Response(
            content=answers.generate_answer(_plain(response), data.model, _timings(started)), headers=_passed_headers(response)
        )

    @post("/embed", summary="Embed one or more inputs", status_code=200)
    async def embed(self, request: Request, data: EmbedRequest, gateway: Gateway, principal: Principal) -> Response:
        started = time.perf_counter_ns()
        response = await gateway.handle(request, principal, "embeddings", to_openai.embed_request(data))
        return Response(
            content=answers.embed_answer(_plain(response), data.model, _timings(started)), headers=_passed_headers(response)
        )

    @post("/embeddings", summary="Embed one prompt (Ollama's older route)", status_code=200)
    async def embeddings(self, request: Request, data: EmbeddingsRequest, gateway: Gateway, principal: Principal) -> Response:
        response = await gateway.handle(request, principal, "embeddings", to_openai.embed_request(data))
        return Response(content=answers.embeddings_answer(_plain(response)), headers=_passed_headers(response))

    @staticmethod
    def _stream(response: Stream, translator: streams.StreamTranslator) -> Stream:
        headers = {k: v for k, v in _passed_headers(response).items() if k.lower() != "cache-control"}
        return Stream(
            ndjson(stream_source(response), translator), media_type=NDJSON, headers={**headers, "cache-control": "no-cache"}
        )

    @staticmethod
    def _loaded(model: str, principal: Principal, names: ModelNames, started: int, *, chat: bool) -> Response:
        """Ollama's answer to an empty prompt: the model is named and usable, nothing is generated (nor metered)."""
        target = names.resolve(model)
        if not principal.may_use(target.name):
            raise PermissionDenied(f"This key may not use the model `{model}`.", param="model", code="model_not_allowed")
        out: JsonObject = {"model": model, "created_at": answers.now_rfc3339()}
        if chat:
            out["message"] = {"role": "assistant", "content": ""}
        else:
            out["response"] = ""
        out.update(done=True, done_reason="load", total_duration=time.perf_counter_ns() - started)
        return Response(content=out)


def _progress(event: JsonObject, target: str) -> JsonObject:
    if event.get("state") == "done":
        return {"status": "success"}
    if event.get("state") in ("failed", "cancelled"):
        return {"error": str(event.get("message") or event.get("state"))}
    out: JsonObject = {"status": str(event.get("message") or f"pulling {target}")}
    if event.get("total_bytes"):
        out.update(digest=target, total=event["total_bytes"], completed=event.get("done_bytes") or 0)
    return out


class OllamaAdminController(Controller):
    """``/api/pull`` and ``/api/delete``: the store's pull and delete, for admin keys."""

    path = "/api"
    opt = {**requires(Access.ADMIN), **ollama_errors()}
    tags = ["Ollama-compatible API"]
    dependencies = CHANGES

    @post(
        "/pull", summary="Pull a catalog model, a GGUF URL, a hub spec or a variant available on the hub (admin)", status_code=200
    )
    async def pull(self, data: PullRequest, store: ModelStore, changes: StoreChanges, jobs: JobRegistry) -> Response:
        requested = data.model or data.name
        if not requested:
            raise BadRequest("model is required", param="model")
        if data.insecure:
            raise BadRequest("insecure pulls are not supported: downloads always verify TLS.", param="insecure")
        is_url = requested.startswith(("https://", "http://", "hf:"))
        hub = await asyncio.to_thread(store.prepare_requested_pull, requested if is_url else None, None if is_url else requested)
        if hub is not None:  # a hub spec, or a variant available on the hub
            name = hub.name
            job = changes.start("pull", name, lambda ctx: store.pull_hub(hub, ctx=ctx))
        else:
            url, sha256, family, variant = await asyncio.to_thread(
                store.prepare_pull, requested if is_url else None, name=None if is_url else requested
            )
            name = f"{family}:{variant}"
            job = changes.start("pull", name, lambda ctx: store.pull(url, sha256=sha256, name=name, ctx=ctx))
        events = jobs.follow(int(job["id"]))
        if data.stream is False:
            async for _ in events:
                pass
            finished = jobs.get(int(job["id"]))
            if finished.state != "done":
                raise JobFailed(finished.error or {"message": finished.message or finished.state})
            return Response(content={"status": "success"})

        async def progress() -> AsyncIterator[bytes]:
            yield _line({"status": "pulling manifest"})
            async for event in events:
                if event.get("type") == "progress" or event.get("state") in ("done", "failed", "cancelled"):
                    yield _line(_progress(event, name))

        return Stream(progress(), media_type=NDJSON)

    @delete("/delete", summary="Delete an installed variant (admin)", status_code=200, sync_to_thread=True)
    def delete_model(self, data: DeleteRequest, store: ModelStore, changes: StoreChanges) -> None:
        name = data.model or data.name
        if not name:
            raise BadRequest("model is required", param="model")
        store.delete(name)
        changes.record("model.delete", name)
