"""One request cannot overrun a token budget: the gateway caps max_tokens to the allowance left.

Through the real daemon and the default model: a key with ``tokens_per_day`` 1000 sends
eight concurrent requests that would each generate far more than 1000 tokens; every
answer is complete (finish_reason ``stop`` or ``length``) or a 429 in OpenAI's error
shape, and the settled total never exceeds the limit.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon

LIMIT = 1000
PROMPT = "Chapter 1.\n\nThe dragon"


def _limited_key(daemon: RunningDaemon, name: str, **limits: float) -> str:
    secret = daemon.create_key(name)
    with daemon.admin() as admin:
        admin.put(f"/admin/quotas/key:{secret[:12]}", json=limits).raise_for_status()
    return secret


def _spent(daemon: RunningDaemon, secret: str) -> dict:
    with daemon.admin() as admin:
        response = admin.get(f"/admin/quotas/key:{secret[:12]}")
        response.raise_for_status()
        # a counter is created by the first admission; a refused one leaves none
        return response.json()["usage"].get("tokens_per_day", {"spent": 0, "reserved": 0})


def _concurrently(daemon: RunningDaemon, secret: str, path: str, body: dict, n: int = 8) -> list[httpx.Response]:
    def one(_: int) -> httpx.Response:
        with daemon.client(secret, timeout=600) as client:
            return client.post(path, json=body)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _check_answers(responses: list[httpx.Response], text_of) -> list[dict]:
    answered = []
    for response in responses:
        if response.status_code == 429:
            error = response.json()["error"]
            assert error["type"] and error["message"], error
            continue
        assert response.status_code == 200, response.text
        result = response.json()
        choice = result["choices"][0]
        assert choice["finish_reason"] in ("stop", "length"), choice
        assert isinstance(text_of(choice), str)
        answered.append(result)
    return answered


def _check_settled(daemon: RunningDaemon, secret: str, answered: list[dict]) -> None:
    counter = _spent(daemon, secret)
    billed = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in answered)
    print(f"answered {len(answered)}, settled {counter['spent']} of {LIMIT}, reserved {counter['reserved']}")
    assert counter["reserved"] == 0
    assert counter["spent"] == billed
    assert counter["spent"] <= LIMIT


def test_chat_without_max_tokens_cannot_overrun_the_daily_budget(daemon: RunningDaemon):
    secret = _limited_key(daemon, "cap-chat", tokens_per_day=LIMIT)
    body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "temperature": 1.0}
    responses = _concurrently(daemon, secret, "/v1/chat/completions", body)
    answered = _check_answers(responses, lambda c: c["message"]["content"])
    assert answered, [r.text for r in responses]
    _check_settled(daemon, secret, answered)


def test_completions_asking_for_100000_tokens_get_the_allowance_and_stop_at_it(daemon: RunningDaemon):
    secret = _limited_key(daemon, "cap-completions", tokens_per_day=LIMIT)
    # ignore_eos: every answer runs to its cap (sampled at temperature 1, all of them could end early by chance)
    body = {"model": "default", "prompt": PROMPT, "temperature": 1.0, "max_tokens": 100000, "ignore_eos": True}
    responses = _concurrently(daemon, secret, "/v1/completions", body)
    answered = _check_answers(responses, lambda c: c["text"])
    assert answered, [r.text for r in responses]  # capped to the allowance, not refused as "too large"
    assert any(r["choices"][0]["finish_reason"] == "length" for r in answered)
    _check_settled(daemon, secret, answered)


def test_a_prompt_that_does_not_fit_is_refused_before_the_engine(daemon: RunningDaemon):
    secret = _limited_key(daemon, "cap-tiny", tokens_per_day=20)
    body = {"model": "default", "prompt": "word " * 200, "max_tokens": 1}
    with daemon.client(secret) as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] and error["message"], error
    assert response.headers.get("retry-after")
    counter = _spent(daemon, secret)
    assert (counter["spent"], counter["reserved"]) == (0, 0)


def test_completions_default_to_16_tokens(daemon: RunningDaemon):
    secret = daemon.create_key("cap-default")
    with daemon.client(secret) as client:
        response = client.post("/v1/completions", json={"model": "default", "prompt": PROMPT, "temperature": 1.0, "seed": 7})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 16


def test_chat_without_max_tokens_cannot_overrun_a_cost_budget(tmp_path):
    """cost_per_month 0.5 at 0.001 per token (input and output): room for 500 tokens in all."""
    own = start_daemon(tmp_path)
    try:
        with own.admin() as admin:
            admin.put("/admin/prices/*", json={"input_per_m": 1000.0, "output_per_m": 1000.0}).raise_for_status()
        secret = _limited_key(own, "cap-cost", cost_per_month=0.5)
        body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "temperature": 1.0}
        responses = _concurrently(own, secret, "/v1/chat/completions", body)
        answered = _check_answers(responses, lambda c: c["message"]["content"])
        assert answered, [r.text for r in responses]
        with own.admin() as admin:
            counter = admin.get(f"/admin/quotas/key:{secret[:12]}").json()["usage"]["cost_per_month"]
        billed = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in answered) * 0.001
        print(f"answered {len(answered)}, cost settled {counter['spent']:.4f} of 0.5, reserved {counter['reserved']}")
        assert counter["reserved"] == 0
        assert counter["spent"] == pytest.approx(billed)
        assert counter["spent"] <= 0.5 + 1e-9
    finally:
        own.stop()
