"""One whole-request deadline: ``request_timeout_seconds`` covers queueing, generation and streaming.

Through the real daemon and the default model, with the deadline at 8 s and
answers that would take over a minute on two cores (2,000 tokens with the
end-of-generation tokens banned): a plain request is answered 504 in OpenAI's
error shape, a stream ends with a timeout error event and ``[DONE]``; both leave
one ledger row with status 504 charging what was generated, and no reservation
behind them.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

DEADLINE_S = 8.0
NO_EOG = {"1": -100, "106": -100}  # Gemma 3's <eos> and <end_of_turn>
LONG = {"model": "default", "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "logit_bias": NO_EOG}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("deadline"), APPLIANCE_REQUEST_TIMEOUT_SECONDS=str(DEADLINE_S))
    yield running
    running.stop()


def _row(daemon: RunningDaemon, request_id: str) -> tuple[int, int, int]:
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")
    try:
        rows = conn.execute(
            "SELECT status, prompt_tokens, completion_tokens FROM usage WHERE request_id = ?", (request_id,)
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) == 1, rows
    return rows[0]


def _prompt_tokens(daemon: RunningDaemon) -> int:
    """What LONG's prompt costs: the ledger row of the key fixture's request that ran to its end."""
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")
    try:
        (prompt,) = conn.execute("SELECT prompt_tokens FROM usage WHERE status = 200 ORDER BY rowid LIMIT 1").fetchone()
    finally:
        conn.close()
    assert prompt > 0
    return prompt


def _reserved(daemon: RunningDaemon, secret: str) -> float:
    with daemon.admin() as admin:
        usage = admin.get(f"/admin/quotas/key:{secret[:12]}").json()["usage"]
    return sum(d["reserved"] for d in usage.values())


@pytest.fixture(scope="module")
def key(daemon: RunningDaemon) -> str:
    secret = daemon.create_key("deadline")
    with daemon.admin() as admin:
        admin.put(f"/admin/quotas/key:{secret[:12]}", json={"tokens_per_day": 10**9}).raise_for_status()
    with daemon.client(secret, timeout=120) as client:  # load the model before the clock matters
        assert client.post("/v1/completions", json={**LONG, "max_tokens": 1}).status_code == 200
    return secret


def test_a_plain_request_past_the_deadline_is_answered_504_and_metered(daemon: RunningDaemon, key: str):
    started = time.monotonic()
    with daemon.client(key, timeout=120) as client:
        response = client.post("/v1/completions", json=LONG)
    took = time.monotonic() - started
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "timeout" and "request_timeout_seconds" in error["message"]
    assert DEADLINE_S - 0.5 <= took <= DEADLINE_S + 5, took
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")  # an error answer carries no request id: take the newest row
    try:
        (status, prompt) = conn.execute(
            "SELECT status, prompt_tokens FROM usage ORDER BY created_at DESC, rowid DESC LIMIT 1"
        ).fetchone()
    finally:
        conn.close()
    assert status == 504
    assert prompt == _prompt_tokens(daemon)  # the engine read the prompt: it is charged
    assert _reserved(daemon, key) == 0


def test_a_stream_past_the_deadline_ends_with_a_timeout_event_and_is_metered(daemon: RunningDaemon, key: str):
    events: list[str] = []
    started = time.monotonic()
    with (
        daemon.client(key, timeout=120) as client,
        client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    took = time.monotonic() - started
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["code"] == "timeout", error
    text_events = [e for e in events[:-2] if '"choices"' in e]
    assert len(text_events) > 5, events[:5]  # it streamed for a while before the deadline
    assert DEADLINE_S - 0.5 <= took <= DEADLINE_S + 5, took
    status, prompt, completion = _row(daemon, request_id)
    assert status == 504
    assert prompt == _prompt_tokens(daemon)  # the engine read the prompt: it is charged
    assert completion == len(text_events)  # what was streamed is charged
    assert _reserved(daemon, key) == 0
