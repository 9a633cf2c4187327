"""The response cache and token logprobs: separate keys, no semantic answers, folded streams and replays keep them."""

from __future__ import annotations

import json

import msgspec

from appliance.cache.keys import normalized, semantic_text
from appliance.cache.replay import Hit, from_stream
from tests.cachekit import MODEL, chat, completion


def _events(chunks: list[dict]) -> list[bytes]:
    return [b"data: " + msgspec.json.encode(c) for c in chunks]


def _sse_choices(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: {"):
            out.extend(json.loads(block[6:])["choices"])
    return out


def test_logprobs_and_echo_separate_cache_entries_and_their_off_values_fold_away():
    assert normalized(chat(logprobs=True)) != normalized(chat())
    assert normalized(chat(logprobs=True, top_logprobs=3)) != normalized(chat(logprobs=True))
    assert normalized(chat(logprobs=True, top_logprobs=0)) == normalized(chat(logprobs=True))
    assert normalized(chat(logprobs=False, top_logprobs=0)) == normalized(chat())
    assert normalized(completion(logprobs=0)) != normalized(completion())
    assert normalized(completion(logprobs=0)) != normalized(completion(logprobs=2))
    assert normalized(completion(echo=True)) != normalized(completion())
    assert normalized(completion(echo=False)) == normalized(completion())


def test_answers_about_their_own_tokens_never_take_a_semantic_hit():
    assert semantic_text("chat", normalized(chat("How do I reset it?", logprobs=True))) is None
    assert semantic_text("completions", normalized(completion("abc", logprobs=0))) is None
    assert semantic_text("completions", normalized(completion("abc", echo=True))) is None
    assert semantic_text("chat", normalized(chat("How do I reset it?", logprobs=False))) == "How do I reset it?"


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_a_folded_chat_stream_keeps_its_logprobs_and_a_replay_carries_them():
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    chunks = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
        }
    ]
    for token, lp in (("Par", -0.1), ("is", -0.2)):
        chunks.append(
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"content": token}, "finish_reason": None, "logprobs": {"content": [_entry(token, lp)]}}
                ],
            }
        )
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
    folded = from_stream("chat", _events(chunks), {"prompt_tokens": 3, "completion_tokens": 2})
    choice = folded["choices"][0]
    assert choice["message"]["content"] == "Paris"
    assert choice["logprobs"] == {"content": [_entry("Par", -0.1), _entry("is", -0.2)]}
    replayed = _sse_choices(Hit("exact", "chat", folded, 3, 2).sse_bytes(False))
    assert [c["logprobs"] for c in replayed if c["logprobs"]] == [choice["logprobs"]]
    assert json.loads(Hit("exact", "chat", folded, 3, 2).body)["choices"][0]["logprobs"] == choice["logprobs"]


def test_a_folded_completion_stream_joins_every_logprobs_list():
    base = {"id": "cmpl-s", "object": "text_completion", "created": 1, "model": MODEL}
    parts = [
        ("Once", {"tokens": ["Once"], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}),
        (" upon", {"tokens": [" upon"], "token_logprobs": [-1.5], "top_logprobs": [{" upon": -1.5}], "text_offset": [4]}),
    ]
    chunks = [{**base, "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": None}]} for text, lp in parts]
    chunks.append({**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]})
    folded = from_stream("completions", _events(chunks), {})
    lp = folded["choices"][0]["logprobs"]
    assert folded["choices"][0]["text"] == "Once upon"
    assert lp == {
        "tokens": ["Once", " upon"],
        "token_logprobs": [None, -1.5],
        "top_logprobs": [None, {" upon": -1.5}],
        "text_offset": [0, 4],
    }
    replayed = _sse_choices(Hit("exact", "completions", folded, 2, 1).sse_bytes(True))
    assert replayed[0]["text"] == "Once upon" and replayed[0]["logprobs"] == lp


def test_answers_without_logprobs_fold_and_replay_as_before():
    base = {"id": "cmpl-s", "object": "text_completion", "created": 1, "model": MODEL}
    chunks = [{**base, "choices": [{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": "stop"}]}]
    folded = from_stream("completions", _events(chunks), {})
    assert folded["choices"][0]["logprobs"] is None
    assert all(c["logprobs"] is None for c in _sse_choices(Hit("exact", "completions", folded, 1, 1).sse_bytes(False)))
