"""Clients that hang up mid-stream (reliability-table row 14).

What must hold within a second of the hang-up: the request is in the ledger
(status 499) with the tokens produced so far, its quota reservation is
released, the router's in-flight count is back to 0 and the engine's slot is
idle again (the generation was cancelled, not run to ``max_tokens``).
"""

from __future__ import annotations

import socket
import time

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
FREED_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def quota_key(long_box):
    key = long_box.create_key("disconnects")
    with long_box.admin() as admin:
        response = admin.put(f"/admin/quotas/key:{key[:12]}", json={"max_concurrent": 2, "tokens_per_day": 10_000_000})
        assert response.status_code == 200, response.text
    return key


def _all_freed(box, key: str, engine: str) -> bool:
    inflight = instances(box)[TINY]["inflight"]
    slots_busy = engine_get(engine, "/stats").json()["slots_busy"]
    with box.admin() as admin:
        usage = admin.get(f"/admin/quotas/key:{key[:12]}").json()["usage"]
    reserved = usage["max_concurrent"]["reserved"] + usage["tokens_per_day"]["reserved"]
    return inflight == 0 and slots_busy == 0 and reserved == 0


def test_hang_up_mid_stream_records_usage_and_frees_the_reservation_and_the_slot(long_box, quota_key):
    engine = engine_socket(int(load(long_box)["pid"]))
    chunks = 0
    with long_box.client(quota_key, timeout=60) as client:
        body = chat_body("a very long story", max_tokens=LONG, logit_bias=NO_EOS, stream=True)
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            events = sse_events(response.iter_lines())
            for event in events:
                if isinstance(event, dict) and event.get("choices") and event["choices"][0]["delta"].get("content"):
                    chunks += 1
                if chunks == 20:
                    break
            stats = engine_get(engine, "/stats").json()
            assert stats["slots_busy"] == 1, (stats, list(events)[-3:])  # still generating when the client leaves
        # leaving both blocks closes the connection: the client is gone
    gone_at = time.monotonic()
    wait_until(
        lambda: _all_freed(long_box, quota_key, engine), FREED_WITHIN_S + 1.0, 0.05, "slot, in-flight count and reservation freed"
    )
    assert time.monotonic() - gone_at < FREED_WITHIN_S + 0.5

    rows = wait_until(
        lambda: db_rows(long_box.data_dir, "SELECT status, completion_tokens FROM usage WHERE request_id = ?", request_id),
        FREED_WITHIN_S,
        0.05,
        "the usage row",
    )
    ((status, completion_tokens),) = rows
    assert status == 499
    assert chunks <= completion_tokens < LONG  # what was produced, not the budget


def test_many_hang_ups_leave_nothing_behind(long_box, quota_key):
    """Ten streams cut at random points, two at a time (the key's max_concurrent): no slot or reservation leaks."""
    engine = engine_socket(int(load(long_box)["pid"]))
    before = db_rows(long_box.data_dir, "SELECT count(*) FROM usage WHERE status = 499")[0][0]
    for i in range(10):
        with long_box.client(quota_key, timeout=60) as client:
            body = chat_body(f"story {i}", max_tokens=LONG, logit_bias=NO_EOS, stream=True)
            with (
                client.stream("POST", "/v1/chat/completions", json=body) as first,
                client.stream(
                    "POST", "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": f"other {i}"}]}
                ) as second,
            ):
                assert first.status_code == second.status_code == 200
                for n, _ in enumerate(first.iter_lines()):
                    if n > i * 7:
                        break
        # the server learns of a hang-up asynchronously: the next pair must wait for it, or its
        # second stream would be refused by the key's max_concurrent quota (a 429, correctly)
        wait_until(lambda: _all_freed(long_box, quota_key, engine), FREED_WITHIN_S + 2.0, 0.05, f"pair {i} freed")
    wait_until(lambda: _all_freed(long_box, quota_key, engine), FREED_WITHIN_S + 2.0, 0.05, "everything freed")
    after = db_rows(long_box.data_dir, "SELECT count(*) FROM usage WHERE status = 499")[0][0]
    assert after - before == 20
    with long_box.client(quota_key) as client:  # the key's two concurrent slots are really free
        assert client.post("/v1/chat/completions", json=chat_body("still there?")).status_code == 200


def test_hang_up_before_a_plain_answer_cancels_the_generation(long_box, quota_key):
    """A non-streamed request whose client times out: the engine stops generating for it."""
    engine = engine_socket(int(load(long_box)["pid"]))
    body = chat_body("a long plain answer", max_tokens=LONG, logit_bias=NO_EOS)
    payload = __import__("json").dumps(body).encode()
    with socket.create_connection(("127.0.0.1", long_box.port)) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {quota_key}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_until(lambda: engine_get(engine, "/stats").json()["slots_busy"] == 1, 30, 0.02, "generation starting")
    gone_at = time.monotonic()
    wait_until(lambda: _all_freed(long_box, quota_key, engine), FREED_WITHIN_S + 1.0, 0.05, "slot freed after a plain hang-up")
    assert time.monotonic() - gone_at < FREED_WITHIN_S + 0.5
    ((status,),) = db_rows(long_box.data_dir, "SELECT status FROM usage ORDER BY id DESC LIMIT 1")
    assert status == 499


def test_hang_up_mid_message_stream_records_usage_and_frees_everything(long_box, quota_key):
    """The same through the Messages API: its translated stream closes the gateway's stream, which settles."""
    engine = engine_socket(int(load(long_box)["pid"]))
    deltas = 0
    body = {
        "model": TINY,
        "max_tokens": LONG,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": "story"}],
    }  # greedy: no end-of-generation token for 12,000 tokens
    with (
        long_box.client(quota_key, timeout=60) as client,
        client.stream("POST", "/v1/messages", json=body, headers={"x-api-key": quota_key}) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        events = sse_events(response.iter_lines())  # held: closing the generator would close the connection here
        for event in events:
            if event.get("type") == "content_block_delta":
                deltas += 1
            if deltas == 20:
                break
        assert deltas == 20, "the message ended before the client left"
        assert engine_get(engine, "/stats").json()["slots_busy"] == 1  # still generating when the client leaves
    gone_at = time.monotonic()
    wait_until(
        lambda: _all_freed(long_box, quota_key, engine), FREED_WITHIN_S + 1.0, 0.05, "slot, in-flight count and reservation freed"
    )
    assert time.monotonic() - gone_at < FREED_WITHIN_S + 0.5
    rows = wait_until(
        lambda: db_rows(
            long_box.data_dir, "SELECT status, endpoint, completion_tokens FROM usage WHERE request_id = ?", request_id
        ),
        FREED_WITHIN_S,
        0.05,
        "the usage row",
    )
    ((status, endpoint, completion_tokens),) = rows
    assert (status, endpoint) == (499, "messages")
    assert deltas <= completion_tokens < LONG
