"""A job card's live stream ends on the job's final state, whatever the timing of the job's end.

The race behind a quantize card left at "running 96%": the job's thread marked the job finished and
only then appended its final event, so a follower polling in between saw a finished job with no new
event and stopped. Here the job's thread is held back right at its final event (as a busy box can
hold it), while the real registry's follower and the console's SSE generator keep polling; the last
card they send must show the job done at 100%.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from appliance.jsontypes import JsonObject
from appliance.store.jobs import TERMINAL, Job, JobContext, JobRegistry
from appliance.webui.jobs_view import _events

HOLD_S = 0.6  # the follower polls several times while the final event is held back


@pytest.fixture
def held_final_event(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Holds the job thread just before it records its terminal state event, until ``release`` is set."""
    reached, release = threading.Event(), threading.Event()
    original = Job._emit

    def emit(self: Job, type_: str, **extra: str) -> JsonObject:
        entering = extra.get("state", self.state)
        if type_ == "state" and entering in TERMINAL and self.kind == "quantize":
            reached.set()
            release.wait(10)
        return original(self, type_, **extra)

    monkeypatch.setattr(Job, "_emit", emit)
    return reached, release


def _almost_done(go: threading.Event):
    """Work that reports 96%, then ends once the follower has seen that (so the follower is known to be
    waiting for the job's end, not catching up on earlier events)."""

    def work(ctx: JobContext) -> dict[str, str]:
        ctx.progress(96, 100, force=True)
        go.wait(10)
        return {"name": "tiny:q4_0"}

    return work


async def _release_after_polls(reached: threading.Event, release: threading.Event) -> None:
    await asyncio.to_thread(reached.wait, 10)
    await asyncio.sleep(HOLD_S)
    release.set()


def test_follow_ends_with_the_final_event_when_the_job_thread_is_held_back(held_final_event):
    reached, release = held_final_event
    jobs, go = JobRegistry(), threading.Event()
    job = jobs.submit("quantize", "tiny:q4_0", _almost_done(go))

    async def follow() -> list[dict]:
        out = []
        async for event in jobs.follow(job.id, 0, poll=0.02):
            out.append(event)
            if event["progress"] == 0.96:
                go.set()
        return out

    async def main() -> list[dict]:
        events, _ = await asyncio.gather(follow(), _release_after_polls(reached, release))
        return events

    events = asyncio.run(main())
    assert job.wait(10) and job.state == "done"
    assert events[-1]["state"] == "done" and events[-1]["progress"] == 1.0, events[-1]


def test_the_card_stream_shows_done_when_the_job_thread_is_held_back(held_final_event):
    reached, release = held_final_event
    jobs, go = JobRegistry(), threading.Event()
    job = jobs.submit("quantize", "tiny:q4_0", _almost_done(go))

    async def cards() -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        stream = _events(jobs, job, can_cancel=True)
        async for message in stream:
            out.append((str(message.event), str(message.data)))
            if "96%" in str(message.data) and len(out) == 1 + len(job.events_after(0)):  # caught up: one card per event
                go.set()
            if message.event == "done":
                await stream.aclose()  # the stream lingers so the browser closes first; not needed here
                break
        return out

    async def main() -> list[tuple[str, str]]:
        sent, _ = await asyncio.gather(cards(), _release_after_polls(reached, release))
        return sent

    sent = asyncio.run(main())
    last_card = [data for event, data in sent if event == "progress"][-1]
    assert 'data-state="done"' in last_card and "100%" in last_card, last_card
    assert "Cancel" not in last_card
