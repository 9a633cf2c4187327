"""Cache keys: what is normalized away, what separates entries, and which requests may be cached."""

from __future__ import annotations

import pytest

from appliance.cache.keys import (
    Policy,
    cache_control,
    cache_key,
    is_deterministic,
    merge_policy,
    normalized,
    partition,
    scope_key,
    semantic_text,
    validate_policy,
)
from tests.cachekit import MODEL, chat, completion, principal


def key(body, who=None, endpoint="chat", model=MODEL, share="team"):
    return cache_key(partition(who or principal(), share), endpoint, model, normalized(body))


def test_transport_and_attribution_fields_do_not_change_the_key():
    base = key(chat())
    assert key(chat(stream=True, stream_options={"include_usage": True})) == base
    assert key(chat(user="alice")) == base
    assert key(chat(n=1)) == base


def test_equivalent_spellings_share_a_key():
    assert key(chat(max_tokens=50)) == key(chat(max_completion_tokens=50))
    parts = chat()
    parts.messages[0].content = [{"type": "text", "text": "What is the capital of France?"}]
    assert key(parts) == key(chat())
    assert key(completion(prompt=["Once upon a time"]), endpoint="completions") == key(completion(), endpoint="completions")
    assert key(chat(temperature=0.0, frequency_penalty=0)) == key(chat())


def test_greedy_requests_ignore_sampling_knobs_that_cannot_matter():
    assert key(chat(seed=1, top_p=0.5, top_k=10)) == key(chat(seed=2))
    # with sampling on they do matter
    assert key(chat(temperature=0.7, seed=1)) != key(chat(temperature=0.7, seed=2))


@pytest.mark.parametrize(
    "change",
    [
        {"text": "What is the capital of Spain?"},
        {"system": "Answer in French."},
        {"max_tokens": 5},
        {"stop": ["\n"]},
        {"temperature": 0.5, "seed": 3},
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"repeat_penalty": 1.3},
    ],
)
def test_everything_that_changes_the_answer_changes_the_key(change):
    assert key(chat(**change)) != key(chat())


def test_model_endpoint_and_partition_separate_entries():
    assert key(chat(), model="tiny:f16") != key(chat())
    assert key(completion(prompt="What is the capital of France?"), endpoint="completions") != key(chat())
    same_team_a, same_team_b = principal(1, team_id=7), principal(2, team_id=7)
    assert key(chat(), same_team_a) == key(chat(), same_team_b)
    assert key(chat(), principal(1, team_id=7)) != key(chat(), principal(3, team_id=8))
    assert key(chat(), principal(1)) != key(chat(), principal(2))  # keys without a team share nothing
    assert key(chat(), same_team_a, share="key") != key(chat(), same_team_b, share="key")
    assert key(chat(), principal(1), share="global") == key(chat(), principal(2), share="global")


def test_only_deterministic_requests_are_cacheable_by_default():
    assert is_deterministic(chat(temperature=0))
    assert is_deterministic(chat(temperature=0.8, seed=42))
    assert not is_deterministic(chat(temperature=0.8))
    unset = chat()
    unset.temperature = None  # OpenAI's default temperature is 1
    assert not is_deterministic(unset)


def test_policy_layers_and_team_opt_out():
    base = Policy(semantic=True, semantic_threshold=0.95)
    assert merge_policy(base, None, None, None) == base
    widened = merge_policy(base, None, None, {"cache_nondeterministic": True, "semantic_threshold": 0.97})
    assert widened.cache_nondeterministic and widened.semantic_threshold == 0.97
    # a team opt-out binds its keys even when a key says enabled
    assert not merge_policy(base, None, {"enabled": False}, {"enabled": True}).enabled
    assert not merge_policy(base, {"enabled": False}, None, None).enabled
    # broken stored values are ignored, not fatal
    assert merge_policy(base, {"semantic_threshold": "high", "share": "world"}) == base


def test_policy_validation():
    assert validate_policy({"semantic_threshold": 1}) == {"semantic_threshold": 1.0}
    for bad in ({"bogus": True}, {"enabled": "no"}, {"semantic_threshold": 0}, {"share": "everyone"}):
        with pytest.raises(ValueError):
            validate_policy(bad)


def test_cache_control_header():
    assert cache_control({}) == (True, True)
    assert cache_control({"cache-control": "no-cache"}) == (False, True)
    assert cache_control({"cache-control": "max-age=0, no-store"}) == (False, False)
    assert cache_control({"cache-control": "No-Cache"}) == (False, True)


def test_semantic_text_and_scope():
    doc = normalized(chat("How do I reset my password?", system="You are IT support."))
    assert semantic_text("chat", doc) == "How do I reset my password?"
    scope = scope_key("team:1", "chat", MODEL, doc)
    assert scope == scope_key(
        "team:1", "chat", MODEL, normalized(chat("How can I change my password?", system="You are IT support."))
    )
    assert scope != scope_key("team:1", "chat", MODEL, normalized(chat("How do I reset my password?", system="You are HR.")))
    assert scope != scope_key(
        "team:1", "chat", MODEL, normalized(chat("How do I reset my password?", system="You are IT support.", max_tokens=9))
    )
    assert scope != scope_key("team:2", "chat", MODEL, doc)
    assert semantic_text("completions", normalized(completion("abc"))) == "abc"
    last_is_assistant = chat()
    last_is_assistant.messages[0].role = "assistant"
    assert semantic_text("chat", normalized(last_is_assistant)) is None
