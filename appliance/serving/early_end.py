"""Requests that end before their answer is complete: a client that hangs up, and what such a request is charged.

Whatever the engine processed is charged, whether the client stayed or not. A
request that ends early (the client left, the deadline passed) is charged its
whole prompt once the engine took it (a stream's answer started; a plain request
was sent), plus the completion tokens relayed. The engine cannot say how far it
read a prompt it was told to drop, and charging only a finished prefill would
leave a long prompt free to anyone who hangs up just before its first token. An
engine fault is the appliance's failure, not the client's: it charges the prompt
only once a generated token shows the prefill was done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from litestar import Request, Response

from appliance.errors import ApplianceError
from appliance.jsontypes import JsonObject
from appliance.serving.context import RequestContext


class ClientDisconnected(ApplianceError):
    """The client hung up before its answer was ready; the generation was cancelled."""

    status = 499  # nginx's "client closed request": only ever seen in the ledger
    type = "invalid_request_error"
    code = "client_disconnected"


async def _hang_up(request: Request) -> None:
    """Return when the client closes the connection (its body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response:
    """Await ``work``; if the client hangs up first, cancel it so the engine stops generating for nobody."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_hang_up(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # frees the lease and the engine connection
    if task.cancelled():
        raise ClientDisconnected("The client closed the connection before the answer was ready.")
    return task.result()


def prompt_read(ctx: RequestContext, usage: JsonObject | None, *, prefilled: bool) -> int:
    """The prompt tokens a stream that ended early is charged: the engine's count when it sent one, else the
    request's prompt when the engine took it and has read it (``prefilled``) or may have, else nothing."""
    reported = (usage or {}).get("prompt_tokens")
    if reported is not None:
        return int(reported)
    return ctx.prompt_charge if prefilled and ctx.engine_took else 0


def role_only(event: bytes) -> bool:
    """Whether a chat stream's event only opens the assistant's turn (a role and empty content: no token)."""
    compact = event.replace(b" ", b"")
    return b'"delta":{"role":"assistant","content":""}' in compact or b'"delta":{"role":"assistant"}' in compact
