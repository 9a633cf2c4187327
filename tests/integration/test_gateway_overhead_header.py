"""The daemon's own cost, shown on every response and in /metrics, through the real daemon and engine."""

from __future__ import annotations

import re
import time

import httpx

HEADER = "x-appliance-overhead-ms"


def _overhead_count(daemon, endpoint: str) -> int:
    with daemon.admin() as admin:
        text = admin.get("/metrics").text
    match = re.search(rf'^appliance_gateway_overhead_seconds_count{{endpoint="{endpoint}"}} (\d+)$', text, re.M)
    return int(match.group(1)) if match else 0


def _overhead_ms(response: httpx.Response) -> float:
    value = float(response.headers[HEADER])
    assert value >= 0
    return value


def test_every_response_says_what_the_daemon_itself_spent(daemon, api_key):
    before = _overhead_count(daemon, "chat")
    chat = {
        "model": "default",
        "messages": [{"role": "user", "content": f"Overhead {time.time_ns()}"}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    with daemon.client(api_key) as client:
        started = time.perf_counter()
        plain = client.post("/v1/chat/completions", json=chat)
        latency_ms = (time.perf_counter() - started) * 1000
        assert plain.status_code == 200, plain.text
        # generating 24 tokens is engine time, not the daemon's: the overhead is a small part of the latency
        assert _overhead_ms(plain) < latency_ms / 2

        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**chat, "stream": True, "messages": [{"role": "user", "content": f"S {time.time_ns()}"}]},
        ) as stream:
            assert stream.status_code == 200
            head_overhead = _overhead_ms(stream)
            body = b"".join(stream.iter_bytes())
        assert body.endswith(b"data: [DONE]\n\n") and head_overhead < latency_ms

        repeat = client.post("/v1/chat/completions", json=chat)  # the exact cache answers: all of it is the daemon's time
        assert repeat.headers["x-cache"] == "exact"
        _overhead_ms(repeat)

        for refused in (
            client.get("/v1/nope"),
            httpx.get(f"{daemon.url}/v1/models"),
            client.post("/v1/chat/completions", json={**chat, "model": "no-such-model"}),
        ):
            assert refused.status_code in (401, 404), refused.text
            _overhead_ms(refused)
    with daemon.admin() as admin:
        _overhead_ms(admin.get("/admin/instances/"))
    # the histogram counts the requests the gateway served (the three chats), observed at their last byte
    deadline = time.monotonic() + 5
    while _overhead_count(daemon, "chat") < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _overhead_count(daemon, "chat") == before + 3
