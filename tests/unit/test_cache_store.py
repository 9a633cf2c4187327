"""The exact tier on a real SQLite database: store, hit, replay, TTL, LRU cap, headers, purge, stats."""

from __future__ import annotations

import json
import time

import pytest

from appliance.cache.replay import from_stream
from tests.cachekit import (
    MODEL,
    chat,
    chat_events,
    chat_result,
    collect,
    completion,
    completion_events,
    completion_result,
    make_cache,
    principal,
    sse_events,
)

WHO = principal(1, team_id=None)


@pytest.fixture
def cache(tmp_path):
    c = make_cache(tmp_path)
    yield c
    c.close()


def stored(cache, body=None, result=None, who=WHO, endpoint="chat", headers=None):
    cache.store(who, endpoint, MODEL, body or chat(), result or chat_result(), headers or {})
    cache.flush()


def test_store_then_exact_hit_with_fresh_id_and_cached_usage(cache):
    assert cache.lookup(WHO, "chat", MODEL, chat(), {}) is None
    stored(cache)
    hit = cache.lookup(WHO, "chat", MODEL, chat(stream=True, user="bob"), {})
    assert hit is not None and hit.tier == "exact" and hit.similarity is None
    assert (hit.prompt_tokens, hit.completion_tokens) == (9, 2)
    body = json.loads(hit.body)
    assert body["choices"][0]["message"]["content"] == "Paris."
    assert body["id"] != "chatcmpl-engine" and body["id"].startswith("chatcmpl-")
    assert body["created"] >= int(time.time()) - 5
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 9
    other = cache.lookup(WHO, "chat", MODEL, chat(), {})
    assert json.loads(other.body)["id"] != body["id"]


def test_hit_survives_a_restart_and_is_read_from_sqlite(tmp_path):
    first = make_cache(tmp_path)
    stored(first)
    first.close()
    second = make_cache(tmp_path)
    try:
        assert len(second._hot) == 0
        assert second.lookup(WHO, "chat", MODEL, chat(), {}).tier == "exact"
    finally:
        second.close()


def test_nondeterministic_requests_are_not_cached_unless_policy_widens(cache):
    hot = chat(temperature=0.9)
    stored(cache, hot)
    assert cache.lookup(WHO, "chat", MODEL, hot, {}) is None
    assert cache.stats()["entries"] == 0
    widened = principal(1, policy={"cache_nondeterministic": True})
    stored(cache, hot, who=widened)
    assert cache.lookup(widened, "chat", MODEL, hot, {}).tier == "exact"


def test_key_and_team_opt_out(cache):
    off = principal(1, policy={"enabled": False})
    stored(cache, who=off)
    assert cache.stats()["entries"] == 0
    cache.set_policy("team", 5, {"enabled": False})
    member = principal(2, team_id=5, policy={"enabled": True})
    stored(cache, who=member)
    assert cache.lookup(member, "chat", MODEL, chat(), {}) is None
    assert cache.stats()["entries"] == 0
    cache.set_policy("team", 5, None)
    stored(cache, who=member)
    assert cache.lookup(member, "chat", MODEL, chat(), {}).tier == "exact"


def test_global_policy_disables_everything(cache):
    cache.set_policy("global", None, {"enabled": False})
    stored(cache)
    assert cache.lookup(WHO, "chat", MODEL, chat(), {}) is None
    assert cache.get_policy("global") == {"enabled": False}


def test_cache_control_no_cache_skips_lookup_but_stores(cache):
    stored(cache, result=chat_result("old"))
    assert cache.lookup(WHO, "chat", MODEL, chat(), {"cache-control": "no-cache"}) is None
    stored(cache, result=chat_result("new"), headers={"cache-control": "no-cache"})
    assert json.loads(cache.lookup(WHO, "chat", MODEL, chat(), {}).body)["choices"][0]["message"]["content"] == "new"
    assert cache.stats()["entries"] == 1


def test_cache_control_no_store_skips_both(cache):
    stored(cache, headers={"cache-control": "no-store"})
    assert cache.stats()["entries"] == 0
    stored(cache)
    assert cache.lookup(WHO, "chat", MODEL, chat(), {"cache-control": "no-store"}) is None


def test_cache_disabled_setting(tmp_path):
    c = make_cache(tmp_path, cache_enabled=False)
    try:
        stored(c)
        assert c.lookup(WHO, "chat", MODEL, chat(), {}) is None
        assert c.stats()["entries"] == 0
    finally:
        c.close()


def test_incomplete_and_failed_answers_are_not_stored(cache):
    stored(cache, result=chat_result(finish=None))
    stored(cache, body=chat("x"), result={"error": {"message": "boom"}})
    cache.store_stream(WHO, "chat", MODEL, chat("y"), chat_events(["a", "b"], finish=None), {}, {})
    cache.flush()
    assert cache.stats()["entries"] == 0


def test_ttl_expiry(tmp_path):
    c = make_cache(tmp_path, cache_ttl_seconds=1)
    try:
        stored(c)
        assert c.lookup(WHO, "chat", MODEL, chat(), {}) is not None
        time.sleep(1.1)
        assert c.lookup(WHO, "chat", MODEL, chat(), {}) is None  # hot entry expired
        c._hot.clear()
        assert c.lookup(WHO, "chat", MODEL, chat(), {}) is None  # and the row too
        assert c.expire_now() == 1
        assert c.stats()["entries"] == 0 and c.stats()["expired"] == 1
    finally:
        c.close()


def test_size_cap_evicts_least_recently_used(tmp_path):
    c = make_cache(tmp_path, cache_max_entries=3)
    try:
        for q in ("a", "b", "c"):
            stored(c, chat(q))
        assert c.lookup(WHO, "chat", MODEL, chat("a"), {}) is not None  # a is now the most recent
        c.flush()
        stored(c, chat("d"))
        s = c.stats()
        assert s["entries"] == 3 and s["evicted"] == 1
        assert c.lookup(WHO, "chat", MODEL, chat("b"), {}) is None
        for q in ("a", "c", "d"):
            assert c.lookup(WHO, "chat", MODEL, chat(q), {}) is not None, q
    finally:
        c.close()


def test_purge_by_model_key_and_all_keeps_memory_coherent(cache):
    alice, bob = principal(1), principal(2)
    stored(cache, who=alice)
    stored(cache, who=bob)
    cache.store(alice, "chat", "other:f16", chat(), chat_result(), {})
    cache.flush()
    assert cache.lookup(alice, "chat", MODEL, chat(), {}) is not None  # in the hot LRU now
    assert cache.purge(key_id=1) == 2
    assert cache.lookup(alice, "chat", MODEL, chat(), {}) is None
    assert cache.lookup(bob, "chat", MODEL, chat(), {}) is not None
    stored(cache, who=alice)
    assert cache.purge(model="tiny") == 2  # a family: all its variants
    assert cache.lookup(bob, "chat", MODEL, chat(), {}) is None
    stored(cache, who=bob)
    assert cache.purge() == 1
    assert cache.stats()["entries"] == 0 and cache.lookup(bob, "chat", MODEL, chat(), {}) is None


async def test_stream_answer_serves_a_plain_request_and_replays_as_stream(cache):
    cache.store_stream(
        WHO,
        "chat",
        MODEL,
        chat(stream=True),
        chat_events(["Pa", "ris", "."]),
        {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        {},
    )
    cache.flush()
    hit = cache.lookup(WHO, "chat", MODEL, chat(), {})
    body = json.loads(hit.body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "Paris."},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert (hit.prompt_tokens, hit.completion_tokens) == (9, 3)
    raw = await collect(hit.as_sse(want_usage=True))
    events = sse_events(raw)
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "Paris."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    no_usage = sse_events(await collect(hit.as_sse(want_usage=False)))
    assert all(b'"usage"' not in e for e in no_usage)


async def test_plain_answer_replays_as_a_stream_that_folds_back(cache):
    stored(cache, result=chat_result("Paris is the capital."))
    hit = cache.lookup(WHO, "chat", MODEL, chat(stream=True), {})
    events = sse_events(await collect(hit.as_sse(want_usage=False)))
    folded = from_stream("chat", events[:-1], {"prompt_tokens": 9, "completion_tokens": 2})
    assert folded["choices"][0]["message"]["content"] == "Paris is the capital."


async def test_completions_both_ways(cache):
    cache.store_stream(
        WHO,
        "completions",
        MODEL,
        completion(stream=True),
        completion_events([" there", " was"]),
        {"prompt_tokens": 4, "completion_tokens": 2},
        {},
    )
    stored(cache, completion("Hello"), completion_result(" world"), endpoint="completions")
    hit = cache.lookup(WHO, "completions", MODEL, completion(), {})
    assert json.loads(hit.body)["choices"][0]["text"] == " there was"
    assert json.loads(hit.body)["object"] == "text_completion"
    events = sse_events(await collect(cache.lookup(WHO, "completions", MODEL, completion("Hello"), {}).as_sse(True)))
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " world"
    assert chunks[-1]["usage"]["prompt_tokens"] == 4
    assert cache.lookup(WHO, "chat", MODEL, chat("Hello"), {}) is None  # endpoints never share entries


def test_streamed_tool_calls_fold_into_one_message():
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    deltas = [
        {"role": "assistant", "content": None},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    ]
    events = [
        b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}).encode() for d in deltas
    ]
    events.append(
        b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).encode()
    )
    message = from_stream("chat", events, {})["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    ]


async def test_the_stop_string_that_ended_an_answer_survives_the_cache(cache):
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [
        b"data: "
        + json.dumps({**base, "choices": [{"index": 0, "delta": {"content": "Red, "}, "finish_reason": None}]}).encode(),
        b"data: "
        + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "blue"}]}).encode(),
    ]
    folded = from_stream("chat", events, {"prompt_tokens": 3, "completion_tokens": 2})
    assert folded["choices"][0]["stop_reason"] == "blue"
    stored(cache, result=folded)
    hit = cache.lookup(WHO, "chat", MODEL, chat(stream=True), {})
    assert json.loads(hit.body)["choices"][0]["stop_reason"] == "blue"
    chunks = [json.loads(e[6:]) for e in sse_events(await collect(hit.as_sse(want_usage=False)))[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"][0]["stop_reason"] == "blue"
    assert (
        "stop_reason"
        not in from_stream("chat", events[:1] + [events[1].replace(b', "stop_reason": "blue"', b"")], {})["choices"][0]
    )


def test_stats_count_lookups_hits_and_bytes(cache):
    cache.lookup(WHO, "chat", MODEL, chat(), {})
    stored(cache)
    cache.lookup(WHO, "chat", MODEL, chat(), {})
    cache.lookup(WHO, "chat", MODEL, chat(), {})
    cache.lookup(WHO, "chat", MODEL, chat(), {"cache-control": "no-cache"})
    cache.lookup(WHO, "chat", MODEL, chat(), {"cache-control": "no-store"})
    cache.store(WHO, "chat", MODEL, chat(), chat_result(), {"cache-control": "no-store"})
    cache.flush()
    s = cache.stats()
    assert (s["lookups"], s["hits"], s["misses"], s["bypassed"]) == (3, 2, 1, 2)
    assert s["hit_rate"] == pytest.approx(2 / 3, abs=1e-3)
    assert s["hits_by_tier"] == {"exact": 2, "semantic": 0}
    assert s["entries"] == 1 and s["bytes"] > 100 and s["hits_recorded"] == 2


def test_exact_hit_is_fast(cache):
    stored(cache)
    body = chat()
    cache.lookup(WHO, "chat", MODEL, body, {})
    n = 500
    started = time.perf_counter()
    for _ in range(n):
        cache.lookup(WHO, "chat", MODEL, body, {})
    per_hit_ms = (time.perf_counter() - started) / n * 1000
    assert per_hit_ms < 0.3, per_hit_ms


def test_concurrent_lookups_stores_and_purges_stay_consistent(cache):
    import threading

    errors: list[BaseException] = []
    stop = time.monotonic() + 1.0

    def run(fn):
        try:
            while time.monotonic() < stop:
                fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    counter = iter(range(10**9))
    workers = [
        threading.Thread(
            target=run, args=(lambda: cache.store(WHO, "chat", MODEL, chat(f"q{next(counter) % 50}"), chat_result(), {}),)
        ),
        threading.Thread(target=run, args=(lambda: cache.lookup(WHO, "chat", MODEL, chat(f"q{next(counter) % 50}"), {}),)),
        threading.Thread(target=run, args=(lambda: (cache.purge(model=MODEL), time.sleep(0.05)),)),
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    cache.flush()
    cache.purge()
    assert cache.stats()["entries"] == 0
    assert all(cache.lookup(WHO, "chat", MODEL, chat(f"q{i}"), {}) is None for i in range(50))


def test_a_miss_reads_nothing_from_sqlite_and_the_stored_keys_follow_every_change(tmp_path, monkeypatch):
    c = make_cache(tmp_path, cache_max_entries=2)
    reads = []
    by_key = c._rows.by_key
    monkeypatch.setattr(c._rows, "by_key", lambda key, now: reads.append(key) or by_key(key, now))
    try:
        for q in ("never stored", "nor this"):
            assert c.lookup(WHO, "chat", MODEL, chat(q), {}) is None
        assert reads == []  # a miss costs no SQLite read
        stored(c, chat("a"))
        stored(c, chat("b"))
        c._hot.clear()
        assert c.lookup(WHO, "chat", MODEL, chat("a"), {}).tier == "exact"  # read from the row
        assert len(reads) == 1
        c.flush()
        stored(c, chat("c"))  # evicts b, the least recently used
        assert len(c._stored) == 2
        c._hot.clear()
        assert c.lookup(WHO, "chat", MODEL, chat("b"), {}) is None and len(reads) == 1
        assert c.purge(model=MODEL) == 2
        assert len(c._stored) == 0
    finally:
        c.close()
    stored(again := make_cache(tmp_path), chat("d"))
    again.close()
    restarted = make_cache(tmp_path)  # keys are read back from the rows at start
    try:
        assert len(restarted._stored) == 1
        assert restarted.lookup(WHO, "chat", MODEL, chat("d"), {}).tier == "exact"
    finally:
        restarted.close()
