"""The response cache through the real daemon and the real llama.cpp engine: headers, replay both ways, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def ask(client, content, stream=False, headers=None, **fields):
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, **fields}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def sse_text(raw: str) -> tuple[str, dict | None]:
    text, usage = "", None
    for line in raw.split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
    return text, usage


def test_repeat_is_an_exact_hit_and_streams_share_it(daemon):
    key = daemon.create_key("cache-e2e")
    with daemon.client(key) as client:
        first = ask(client, "Name a colour of the sky.")
        assert first.status_code == 200 and first.headers["x-cache"] == "miss"
        second = ask(client, "Name a colour of the sky.", user="someone-else")
        assert second.headers["x-cache"] == "exact"
        a, b = first.json(), second.json()
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]
        assert b["id"] != a["id"]
        streamed = ask(client, "Name a colour of the sky.", stream=True)
        assert streamed.headers["x-cache"] == "exact"
        assert streamed.text.endswith("data: [DONE]\n\n")
        text, usage = sse_text(streamed.text)
        assert text == a["choices"][0]["message"]["content"]
        assert usage["completion_tokens"] == a["usage"]["completion_tokens"]

        live = ask(client, "Count to three:", stream=True)
        assert live.headers["x-cache"] == "miss"
        live_text, _ = sse_text(live.text)
        for _ in range(50):  # the store is written after the response, off the request path
            replay = ask(client, "Count to three:")
            if replay.headers["x-cache"] == "exact":
                break
            time.sleep(0.05)
        assert replay.headers["x-cache"] == "exact"
        assert replay.json()["choices"][0]["message"]["content"] == live_text


def test_cache_control_and_sampling(daemon):
    key = daemon.create_key("cache-e2e-headers")
    with daemon.client(key) as client:
        assert ask(client, "Say hello.", headers={"cache-control": "no-store"}).headers["x-cache"] == "miss"
        assert ask(client, "Say hello.", headers={"cache-control": "no-store"}).headers["x-cache"] == "miss"
        ask(client, "Say hello.")
        assert ask(client, "Say hello.").headers["x-cache"] == "exact"
        assert ask(client, "Say hello.", headers={"cache-control": "no-cache"}).headers["x-cache"] == "miss"
        assert ask(client, "Say hello.", temperature=0.9).headers["x-cache"] == "miss"
        assert ask(client, "Say hello.", temperature=0.9).headers["x-cache"] == "miss"


def test_cli_stats_and_purge(daemon):
    key = daemon.create_key("cache-e2e-cli")
    with daemon.client(key) as client:
        ask(client, "Name a fruit.")
        assert ask(client, "Name a fruit.").headers["x-cache"] == "exact"
    env = {**daemon.env}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-c", "from appliance.cli import main; main()", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    stats = run("cache", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    s = json.loads(stats.stdout)
    assert s["hits_by_tier"]["exact"] >= 1 and s["entries"] >= 1
    prefix = key[:12]
    purged = run("cache", "purge", "--key", prefix)
    assert purged.returncode == 0, purged.stderr
    assert "Purged 1 cached response." in purged.stdout
    with daemon.client(key) as client:
        assert ask(client, "Name a fruit.").headers["x-cache"] == "miss"


def test_semantic_tier_is_off_by_default(daemon):
    key = daemon.create_key("cache-e2e-semantic-default")
    with daemon.client(key) as client:
        ask(client, "How do I rename my account?")
        time.sleep(0.5)
        assert ask(client, "How can I rename my account?").headers["x-cache"] == "miss"


def test_paraphrase_is_a_semantic_hit_with_its_similarity(daemon):
    key = daemon.create_key("cache-e2e-semantic")
    with daemon.admin() as admin:  # the tier is opt-in: a key policy turns it on
        admin.put("/admin/cache/policy", json={"scope": "key", "id": key[:12], "policy": {"semantic": True}}).raise_for_status()
    with daemon.client(key) as client, daemon.admin() as admin:
        stored = admin.get("/admin/cache/stats").json()["stores"]
        first = ask(client, "How do I reset my password?")
        assert first.headers["x-cache"] == "miss"
        # the writer embeds and indexes the prompt after the response (batched with the stores of a
        # few milliseconds); asking the paraphrase before would be a miss, and that miss would be
        # stored and answer every later try exactly
        deadline = time.monotonic() + 10
        while admin.get("/admin/cache/stats").json()["stores"] <= stored and time.monotonic() < deadline:
            time.sleep(0.02)
        again = ask(client, "How can I reset my password?")
        assert again.headers["x-cache"] == "semantic"
        assert 0.95 <= float(again.headers["x-cache-similarity"]) <= 1.0
        assert again.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
        assert ask(client, "How do I reset my email?").headers["x-cache"] == "miss"
