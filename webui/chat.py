"""Playground conversations, pending streamed turns and the Stop signals of running ones, in memory per session."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

from appliance.jsontypes import JsonObject

MAX_TURNS = 40
PENDING_TTL = 120.0


@dataclass
class PendingTurn:
    """A submitted prompt waiting for its stream to be opened (once)."""

    sid: str
    mode: str  # chat | completion
    model: str
    params: JsonObject  # sampling parameters of the OpenAI request
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    created: float = field(default_factory=time.monotonic)


class ChatStore:
    def __init__(self) -> None:
        self._history: dict[str, list[dict[str, str]]] = {}
        self._pending: dict[str, PendingTurn] = {}
        self._running: dict[str, tuple[str, asyncio.Event]] = {}

    def history(self, sid: str) -> list[dict[str, str]]:
        return list(self._history.get(sid, ()))

    def append(self, sid: str, role: str, content: str) -> None:
        turns = self._history.setdefault(sid, [])
        turns.append({"role": role, "content": content})
        del turns[:-MAX_TURNS]

    def clear(self, sid: str) -> None:
        self._history.pop(sid, None)

    def submit(self, turn: PendingTurn) -> str:
        now = time.monotonic()
        for key in [k for k, t in self._pending.items() if now - t.created > PENDING_TTL]:
            del self._pending[key]
        turn_id = secrets.token_urlsafe(16)
        self._pending[turn_id] = turn
        return turn_id

    def take(self, turn_id: str, sid: str) -> PendingTurn | None:
        """The pending turn, once, and only for the session that submitted it."""
        turn = self._pending.get(turn_id)
        if turn is None or turn.sid != sid or time.monotonic() - turn.created > PENDING_TTL:
            return None
        del self._pending[turn_id]
        return turn

    def running(self, turn_id: str, sid: str) -> asyncio.Event:
        """Mark ``turn_id`` as streaming; the returned event is set when its session asks it to stop."""
        stop = asyncio.Event()
        self._running[turn_id] = (sid, stop)
        return stop

    def finished(self, turn_id: str) -> None:
        self._running.pop(turn_id, None)

    def stop(self, turn_id: str, sid: str) -> bool:
        """Ask the running turn to stop; False if it is not running or not the session's own."""
        found = self._running.get(turn_id)
        if found is None or found[0] != sid:
            return False
        found[1].set()
        return True
