"""kill -9 of an engine mid-request and mid-stream (reliability-table row 17).

What must hold afterwards: the client gets a clear answer within seconds (a
503 with ``Retry-After``, or for a stream one error event then ``[DONE]``),
never a hang or a 500; the request is in the ledger with what it cost and its
reservation is released; the supervisor restarts the engine on its own and the
next request succeeds.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.reliability.conftest import LONG
from tests.reliability.kit import (
    NO_EOS,
    TINY,
    chat_body,
    db_rows,
    engine_get,
    engine_socket,
    instances,
    load,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.slow
ANSWER_WITHIN_S = 5.0


def _busy_engine(box) -> int:
    """Load the tiny model and return its engine pid once the engine answers."""
    info = load(box)
    assert info["state"] == "ready"
    return int(info["pid"])


def _restarted(box, old_pid: int) -> dict:
    return wait_until(
        lambda: (i := instances(box).get(TINY)) and i["state"] == "ready" and i["pid"] != old_pid and i,
        60,
        0.2,
        "the engine's automatic restart",
    )


def _quota(box, key: str) -> dict:
    with box.admin() as admin:
        return admin.get(f"/admin/quotas/key:{key[:12]}").json()["usage"]


@pytest.fixture(scope="module")
def quota_key(long_box):
    """A key with quotas, so that leaked reservations would show."""
    key = long_box.create_key("engine-faults")
    with long_box.admin() as admin:
        response = admin.put(f"/admin/quotas/key:{key[:12]}", json={"max_concurrent": 4, "tokens_per_day": 10_000_000})
        assert response.status_code == 200, response.text
    return key


def test_kill_9_of_the_engine_mid_request_is_a_clear_503_and_the_engine_comes_back(long_box, quota_key):
    pid = _busy_engine(long_box)
    socket = engine_socket(pid)
    result: dict = {}

    def ask() -> None:
        with long_box.client(quota_key, timeout=120) as client:
            result["response"] = client.post(
                "/v1/chat/completions", json=chat_body("count to a million", max_tokens=LONG, logit_bias=NO_EOS)
            )
            result["at"] = time.monotonic()

    thread = threading.Thread(target=ask)
    thread.start()
    wait_until(lambda: engine_get(socket, "/stats").json()["slots_busy"] >= 1, 30, 0.02, "the request reaching the engine")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    response: httpx.Response = result["response"]
    assert response.status_code == 503, response.text
    assert result["at"] - killed_at < ANSWER_WITHIN_S
    error = response.json()["error"]
    assert error["code"] == "engine_unavailable" and error["type"] == "server_error"
    assert "restart" in error["message"] and TINY in error["message"]
    assert int(response.headers["retry-after"]) > 0
    request_id = response.headers.get("x-request-id")

    new = _restarted(long_box, pid)
    assert new["pid"] != pid
    with long_box.client(quota_key) as client:
        again = client.post("/v1/chat/completions", json=chat_body("are you back?", max_tokens=8))
    assert again.status_code == 200, again.text
    assert again.json()["usage"]["completion_tokens"] > 0

    usage = _quota(long_box, quota_key)
    assert usage["max_concurrent"]["reserved"] == 0 and usage["tokens_per_day"]["reserved"] == 0
    statuses = [r[0] for r in db_rows(long_box.data_dir, "SELECT status FROM usage ORDER BY id")]
    assert 503 in statuses and statuses[-1] == 200
    if request_id:
        assert db_rows(long_box.data_dir, "SELECT status FROM usage WHERE request_id = ?", request_id) == [(503,)]
    assert long_box.proc.poll() is None


def test_kill_9_of_the_engine_mid_stream_ends_the_stream_with_an_error_event(long_box, quota_key):
    pid = _busy_engine(long_box)
    events: list = []
    with long_box.client(quota_key, timeout=120) as client:
        body = chat_body("tell me everything", max_tokens=LONG, logit_bias=NO_EOS, stream=True)
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            stream = sse_events(response.iter_lines())
            for event in stream:
                events.append(event)
                if len(events) == 10:
                    break
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            events.extend(stream)  # the rest, up to the end of the stream
            ended_at = time.monotonic()
    assert ended_at - killed_at < ANSWER_WITHIN_S
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "engine_unavailable", events[-3:]
    assert not any(isinstance(e, dict) and "error" in e for e in events[:-2])
    content_chunks = sum(1 for e in events if isinstance(e, dict) and e.get("choices"))
    assert content_chunks >= 10

    _restarted(long_box, pid)
    with (
        long_box.client(quota_key) as client,
        client.stream("POST", "/v1/chat/completions", json=chat_body("and now?", max_tokens=8, stream=True)) as again,
    ):
        assert again.status_code == 200
        tail = list(sse_events(again.iter_lines()))
    assert tail[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in tail)

    ((status, completion_tokens),) = db_rows(
        long_box.data_dir, "SELECT status, completion_tokens FROM usage WHERE request_id = ?", request_id
    )
    assert status == 503 and completion_tokens >= 9  # what was produced before the crash is recorded
    usage = _quota(long_box, quota_key)
    assert usage["max_concurrent"]["reserved"] == 0 and usage["tokens_per_day"]["reserved"] == 0
