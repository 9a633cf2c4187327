"""Model loads in the console: each installed model's row shows its load live, over SSE.

The models page opens one stream (``/models/loads``). Every load event the
router publishes (:mod:`appliance.serving.load_events`) arrives as an SSE event
named after the model (:func:`event_name`), carrying the rendered
``_load.html``; the model's row swaps it into its load cell. On connect the
stream first replays the loads already under way, so a page opened mid-load
catches up. A row rendered by the server shows the model's latest event, so
a failed load keeps its reason on the row until the next load or an unload.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from litestar import get
from litestar.handlers import HTTPRouteHandler
from litestar.response import ServerSentEvent, ServerSentEventMessage

from appliance.serving.load_events import LoadEvent, LoadEvents
from appliance.webui.render import render


def event_name(model: str) -> str:
    """The SSE event name of ``model``'s loads: a model name may hold characters an event name should not."""
    return "load-" + hashlib.sha256(model.encode()).hexdigest()[:16]


def _message(event: LoadEvent) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=render("_load.html", load=event), event=event_name(event.model))


async def _events(load_events: LoadEvents) -> AsyncIterator[ServerSentEventMessage]:
    follow = load_events.follow()
    try:
        yield ServerSentEventMessage(comment="following model loads")
        for event in load_events.in_progress():
            yield _message(event)
        async for event in follow:
            yield _message(event)
    finally:
        follow.close()


def load_handlers() -> list[HTTPRouteHandler]:
    @get("/models/loads", include_in_schema=False)
    async def load_stream(load_events: LoadEvents) -> ServerSentEvent:
        return ServerSentEvent(_events(load_events), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return [load_stream]
