"""Playground: chat with a model; tokens stream into the page over SSE.

The page never holds an API key. A prompt is POSTed (CSRF-checked) and kept as a
pending turn; the page then opens ``/playground/stream/{turn}`` with htmx's SSE
extension, and that route runs the request through the gateway in-process as
the signed-in console user (admission, cache, routing and metering included),
relaying each token as an escaped HTML ``token`` event, then ``usage`` and
``done``. A turn can be streamed once, and only by the session that made it.

The API call carries none of the browser's headers: they belong to the
console's own request (an EventSource always sends ``Cache-Control: no-cache``,
which would make every turn a cache miss), so the cache answers a turn as it
would answer the same request from an API client, and the usage line shows the
tier the gateway's ``x-cache`` header names. Stop (``/playground/stop/{turn}``)
ends the turn's request itself: the gateway closes the engine's stream, so the
engine stops generating, and the ledger records the request as abandoned (499)
with the tokens produced so far.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, get, post
from litestar.response import ServerSentEvent, ServerSentEventMessage
from litestar.utils.scope.state import CONNECTION_STATE_KEY
from markupsafe import escape

from appliance.accounts.keys import Principal
from appliance.errors import ApplianceError, BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest
from appliance.serving.context import Body
from appliance.serving.gateway import Gateway
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.webui import forms
from appliance.webui.chat import ChatStore, PendingTurn
from appliance.webui.context import Console, ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import page, partial, render

LINGER_S = 15.0
MAX_PROMPT = 32_000


def duration(seconds: float) -> str:
    """A duration for people: milliseconds below a second, else seconds with one decimal ("840 ms", "13.9 s")."""
    if seconds < 0.9995:
        return f"{max(seconds, 0.0) * 1000:.0f} ms"
    return f"{seconds:.1f} s"


def _is_base(entry: JsonObject | None) -> bool:
    caps = entry.get("capabilities") if entry else None
    return isinstance(caps, list) and "completion" in caps and "chat" not in caps


def model_choices(router: Router, names: ModelNames) -> list[JsonObject]:
    """Loaded models first, then every other installed variant and alias; base models are marked ``base``."""
    listing = {str(entry["id"]): entry for entry in names.listing()}
    choices: dict[str, JsonObject] = {
        name: {"name": name, "loaded": True, "base": _is_base(listing.get(name))} for name in sorted(router.instances)
    }
    for name, entry in listing.items():
        choices.setdefault(name, {"name": name, "loaded": False, "target": entry.get("target"), "base": _is_base(entry)})
    return list(choices.values())


@get("/playground", guards=[needs("operator")], include_in_schema=False, sync_to_thread=True)
def playground(request: Request, router: Router, names: ModelNames, console: Console, user: ConsoleUser) -> Response:
    return page(
        request,
        "playground.html",
        active="playground",
        models=model_choices(router, names),
        history=console.chats.history(user.sid),
    )


@post("/playground/send", guards=[needs("operator")], include_in_schema=False)
async def send(request: Request, console: Console, user: ConsoleUser) -> Response:
    form = await request.form()
    model = str(form.get("model") or "").strip()
    prompt = str(form.get("prompt") or "")
    mode = "completion" if form.get("mode") == "completion" else "chat"
    if not model:
        raise BadRequest("Choose a model.", param="model")
    if not prompt.strip():
        raise BadRequest("Write a prompt first.", param="prompt")
    if len(prompt) > MAX_PROMPT:
        raise BadRequest("The prompt is too long for the playground.", param="prompt")
    params = {
        "temperature": forms.number(form, "temperature", float, 0.0, 2.0),
        "top_p": forms.number(form, "top_p", float, 0.0, 1.0),
        "max_tokens": forms.number(form, "max_tokens", int, 1, 8192),
    }
    chats = console.chats
    turn = PendingTurn(sid=user.sid, mode=mode, model=model, params={k: v for k, v in params.items() if v is not None})
    if mode == "chat":
        system = str(form.get("system") or "").strip()
        turn.messages = ([{"role": "system", "content": system}] if system else []) + chats.history(user.sid)
        turn.messages.append({"role": "user", "content": prompt})
        chats.append(user.sid, "user", prompt)
    else:
        turn.prompt = prompt
    turn_id = chats.submit(turn)
    return partial(request, "_turn.html", turn_id=turn_id, prompt=prompt, mode=mode, model=model)


@post("/playground/clear", guards=[needs("operator")], include_in_schema=False, sync_to_thread=False)
def clear(console: Console, user: ConsoleUser) -> Response:
    console.chats.clear(user.sid)
    return Response(content="", media_type="text/html")


def _request_body(turn: PendingTurn) -> tuple[str, Body]:
    common = {"model": turn.model, "stream": True, "stream_options": {"include_usage": True}, **turn.params}
    try:
        if turn.mode == "chat":
            return "chat", msgspec.convert({**common, "messages": turn.messages}, ChatCompletionRequest)
        return "completions", msgspec.convert({**common, "prompt": turn.prompt}, CompletionRequest)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"Invalid request: {exc}") from None


def _events(chunk_buffer: bytes) -> tuple[list[bytes], bytes]:
    *complete, rest = chunk_buffer.split(b"\n\n")
    return [e[6:] for e in complete if e.startswith(b"data: ")], rest


def _as_api_call(request: Request) -> Request:
    """The console request, stripped of the browser's headers, as the gateway's view of the playground's API call."""
    state = {k: v for k, v in request.scope.get("state", {}).items() if k != CONNECTION_STATE_KEY}
    scope = {**request.scope, "headers": [], "state": state}
    return Request(scope, receive=request.receive, send=request.send)  # type: ignore[arg-type]


async def _next_chunk(chunks: AsyncIterator[bytes | str], stop: asyncio.Event) -> bytes | str | None:
    """The stream's next chunk; None when it ended, or when Stop came first (the pending read is then cancelled,
    which closes the gateway's stream: the engine connection is closed and the request settled as abandoned).

    The read runs as its own task; whatever ends this wait (Stop, or the browser leaving, which cancels
    the relay here) ends that task first, so nothing is left running inside the gateway's stream when
    the caller closes it (``aclose()`` of a generator another task is still running raises RuntimeError).
    """
    read = asyncio.ensure_future(anext(chunks))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not read.done():
            read.cancel()
            await asyncio.gather(read, return_exceptions=True)
    if read.cancelled():
        return None
    try:
        return read.result()
    except StopAsyncIteration:
        return None


async def _relay(
    request: Request, gateway: Gateway, chats: ChatStore, user: ConsoleUser, turn_id: str
) -> AsyncIterator[ServerSentEventMessage]:
    turn = chats.take(turn_id, user.sid)
    if turn is None:  # already streamed (a reconnect) or not ours
        yield ServerSentEventMessage(data="end", event="done")
        return
    principal = Principal(kind="user", id=user.id, name=user.username, role="user")
    stop = chats.running(turn_id, user.sid)
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage: JsonObject = {}
    tier = "miss"
    finish_reason: str | None = None
    try:
        endpoint, body = _request_body(turn)
        response = await gateway.handle(_as_api_call(request), principal, endpoint, body)
        tier = dict(response.headers).get("x-cache", "miss")
        iterator = getattr(response, "iterator", None)
        if iterator is None:  # a plain body: nothing to stream
            raise BadRequest("The gateway answered without a stream.")
        chunks = aiter(iterator)
        buffer = b""
        try:
            while (chunk := await _next_chunk(chunks, stop)) is not None:
                buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
                events, buffer = _events(buffer)
                for raw in events:
                    if raw == b"[DONE]":
                        continue
                    data = json.loads(raw)
                    if "error" in data:
                        raise BadRequest(str(data["error"].get("message", "The model failed.")))
                    if data.get("usage"):
                        usage = data["usage"]
                    for choice in data.get("choices") or ():
                        finish_reason = choice.get("finish_reason") or finish_reason
                        piece = (choice.get("delta") or {}).get("content") if turn.mode == "chat" else choice.get("text")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
                            yield ServerSentEventMessage(data=str(escape(piece)), event="token")
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()
    except ApplianceError as exc:
        yield ServerSentEventMessage(data=render("_alert.html", kind="error", message=exc.message), event="failure")
    finally:
        chats.finished(turn_id)
    elapsed = time.perf_counter() - started
    if turn.mode == "chat" and text:
        chats.append(user.sid, "assistant", "".join(text))
    completion = int(usage.get("completion_tokens") or len(text))
    stats = {
        "model": turn.model,
        "tier": tier,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": completion,
        "ttft": duration(first - started) if first else None,
        # a cache replay generated nothing: its speed would be the replay's, not the model's
        "cached": tier != "miss",
        "tokens_per_s": completion / (elapsed - (first - started)) if first and elapsed > (first - started) else None,
        "seconds": duration(elapsed),
        "empty": not text and not stop.is_set(),
        "stopped": stop.is_set(),
        "at_max_tokens": finish_reason == "length" and not stop.is_set(),
    }
    yield ServerSentEventMessage(data=render("_usage_line.html", s=stats), event="usage")
    yield ServerSentEventMessage(data="end", event="done")
    await asyncio.sleep(LINGER_S)  # the page closes the stream on "done"; don't make EventSource reconnect


@get("/playground/stream/{turn_id:str}", guards=[needs("operator")], include_in_schema=False)
async def stream(request: Request, turn_id: str, gateway: Gateway, console: Console, user: ConsoleUser) -> ServerSentEvent:
    return ServerSentEvent(
        _relay(request, gateway, console.chats, user, turn_id), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


@post("/playground/stop/{turn_id:str}", guards=[needs("operator")], include_in_schema=False, sync_to_thread=False)
def stop(turn_id: str, console: Console, user: ConsoleUser) -> Response:
    """Stop the session's running turn: its request is cancelled, not just hidden (204 either way)."""
    console.chats.stop(turn_id, user.sid)
    return Response(content=b"", status_code=204)


HANDLERS = [playground, send, clear, stream, stop]
