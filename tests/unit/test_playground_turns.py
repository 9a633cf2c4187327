"""Playground turns: streamed once, by their own session; Stop reaches only the session's own running turn."""

from __future__ import annotations

from appliance.webui.chat import ChatStore, PendingTurn


def test_a_turn_is_taken_once_and_only_by_its_session():
    chats = ChatStore()
    turn_id = chats.submit(PendingTurn(sid="mine", mode="completion", model="default", params={}, prompt="hi"))
    assert chats.take(turn_id, "theirs") is None
    assert chats.take(turn_id, "mine") is not None
    assert chats.take(turn_id, "mine") is None


def test_stop_reaches_only_the_sessions_own_running_turn():
    chats = ChatStore()
    stop = chats.running("t1", "mine")
    assert chats.stop("t1", "theirs") is False and not stop.is_set()  # another user cannot stop my answer
    assert chats.stop("unknown", "mine") is False
    assert chats.stop("t1", "mine") is True and stop.is_set()
    chats.finished("t1")
    assert chats.stop("t1", "mine") is False
