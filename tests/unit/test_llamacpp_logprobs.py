"""Log-softmax and top-k math, and the OpenAI shapes of logprobs (pure functions, no model)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from appliance.drivers.llamacpp.logprobs import (
    CompletionLogprobs,
    LogprobRecorder,
    LogprobView,
    TokenLogprob,
    chat_logprobs,
    joined,
    log_softmax_at,
    token_text,
)
from appliance.drivers.llamacpp.protocol import Shaper, parse_chat, parse_completion
from appliance.errors import BadRequest

PIECES = {0: b"", 1: b" Hello", 2: b"\xc3", 3: b"\xa9", 4: b"!", 5: b"\xe8", 6: b"1"}


def piece(token: int) -> bytes:
    return PIECES[token]


def test_log_softmax_matches_the_definition_and_lists_the_top_tokens_best_first():
    rng = np.random.default_rng(3)
    row = rng.normal(0, 4, 1000).astype(np.float32)
    expected = row.astype(np.float64) - math.log(np.exp(row.astype(np.float64)).sum())
    got = log_softmax_at(row, 17, 5)
    assert got.token == 17 and got.logprob == pytest.approx(expected[17], abs=1e-5)
    best = np.argsort(-expected)[:5]
    assert [t for t, _ in got.top] == [int(i) for i in best]
    assert [lp for _, lp in got.top] == pytest.approx([expected[i] for i in best], abs=1e-5)
    assert sum(math.exp(lp) for _, lp in got.top) <= 1.0
    assert log_softmax_at(row, 17, 0).top == ()


def test_log_softmax_is_stable_for_huge_logits_and_orders_ties_by_id():
    row = np.array([1000.0, 1000.0, -1000.0, 999.0], dtype=np.float32)
    got = log_softmax_at(row, 3, 3)
    assert [t for t, _ in got.top] == [0, 1, 3]
    assert got.top[0][1] == pytest.approx(got.top[1][1]) and all(math.isfinite(lp) for _, lp in got.top)
    assert math.exp(got.top[0][1]) * 2 + math.exp(got.logprob) == pytest.approx(1.0, abs=1e-6)
    assert log_softmax_at(row, 0, 10).top[-1][0] == 2  # more asked than the vocabulary holds: all of it
    flat = log_softmax_at(np.zeros(5000, dtype=np.float32), 7, 4)
    assert [t for t, _ in flat.top] == [0, 1, 2, 3] and flat.logprob == pytest.approx(-math.log(5000))


def test_top_tokens_of_a_large_peaked_row_are_exact():
    rng = np.random.default_rng(11)
    row = rng.normal(0, 1.5, 262144).astype(np.float32)
    row[4321] += 25.0  # one token far ahead, as a trained model's row often has
    scratch = np.empty_like(row)
    for k in (1, 5, 20):
        got = log_softmax_at(row, 4321, k, scratch)
        assert [t for t, _ in got.top] == [int(i) for i in np.argsort(-row.astype(np.float64), kind="stable")[:k]]
        assert got.top[0] == (4321, pytest.approx(got.logprob))


def test_a_split_character_keeps_its_bytes_and_is_written_with_escapes():
    assert token_text(b"\xc3") == "\\xc3" and token_text(" café".encode()) == " café"
    shaped = chat_logprobs([TokenLogprob(2, -0.5, ((2, -0.5), (4, -1.0))), TokenLogprob(3, -0.1)], piece)
    first, second = shaped["content"]
    assert first == {
        "token": "\\xc3",
        "logprob": -0.5,
        "bytes": [0xC3],
        "top_logprobs": [{"token": "\\xc3", "logprob": -0.5, "bytes": [0xC3]}, {"token": "!", "logprob": -1.0, "bytes": [0x21]}],
    }
    assert bytes(first["bytes"] + second["bytes"]).decode() == "é" and second["top_logprobs"] == []


def test_completion_shape_offsets_run_on_across_calls_and_follow_the_decoded_text():
    shaper = CompletionLogprobs(piece)
    one = shaper.shape([TokenLogprob(0, None), TokenLogprob(1, -1.0, ((4, -0.2),))])
    assert one == {
        "tokens": ["", " Hello"],
        "token_logprobs": [None, -1.0],
        "top_logprobs": [None, {"!": -0.2, " Hello": -1.0}],
        "text_offset": [0, 0],
    }
    # é split in two: both halves start where é does; an incomplete byte then a new character: after its "�"
    two = shaper.shape([TokenLogprob(2, -2.0), TokenLogprob(3, -0.1), TokenLogprob(5, -3.0), TokenLogprob(6, -0.3)])
    assert two["tokens"] == ["\\xc3", "\\xa9", "\\xe8", "1"]
    text = " Helloé�1"
    assert two["text_offset"] == [6, 6, 7, 8] and text[8] == "1"
    assert joined(one, two)["text_offset"] == [0, 0, 6, 6, 7, 8]


def test_view_hands_out_only_what_delivered_events_cover():
    rec = LogprobRecorder(1)
    view = LogprobView("chat", rec, piece)
    rng = np.random.default_rng(0)
    for token in (1, 4):
        rec.stage(rng.normal(size=7).astype(np.float32), token)
        rec.commit()
    rec.stage(rng.normal(size=7).astype(np.float32), 6)  # sampled but not (yet) an output token
    assert view.next() == {"content": []} and not view.pending()
    rec.visible = 1
    assert [c["token"] for c in view.next()["content"]] == [" Hello"]
    rec.visible = rec.mark()
    assert view.pending() and [c["token"] for c in view.next()["content"]] == ["!"]
    assert rec.mark() == 2


def test_echoed_prompt_offsets_drop_the_prefix_space_the_tokenizer_added():
    rec = LogprobRecorder(0, prompt=True)
    rec.add_prompt(0, [(np.zeros(7, dtype=np.float32), 1), (np.zeros(7, dtype=np.float32), 4)])
    view = LogprobView("completion", rec, piece)
    shaped = view.prompt("Hello!")
    assert shaped["tokens"] == ["", " Hello", "!"] and shaped["text_offset"] == [0, 0, 5]
    assert shaped["token_logprobs"] == [None, pytest.approx(-math.log(7)), pytest.approx(-math.log(7))]
    rec.entries.append(TokenLogprob(4, -0.5))
    rec.visible = 1
    assert view.next()["text_offset"] == [6], "the completion's offsets start after the echoed prompt"


def test_chunks_with_logprobs_are_valid_json_and_keep_the_fast_shape_without():
    for kind in ("chat", "completion"):
        shaper = Shaper(kind, "m")
        plain = json.loads(shaper.chunk("hi")[6:])
        assert plain["choices"][0]["logprobs"] is None
        with_lp = json.loads(shaper.chunk("hi", {"content": []})[6:])
        assert with_lp["choices"][0]["logprobs"] == {"content": []} and with_lp["choices"][0]["finish_reason"] is None
        assert json.loads(shaper.full("hi", "stop", {}, logprobs={"content": []}))["choices"][0]["logprobs"] == {"content": []}


MESSAGES = [{"role": "user", "content": "hi"}]


def test_parsing_the_fields():
    assert parse_chat({"messages": MESSAGES}, 512).logprobs is None
    assert parse_chat({"messages": MESSAGES, "logprobs": True}, 512).logprobs == 0
    assert parse_chat({"messages": MESSAGES, "logprobs": True, "top_logprobs": 20}, 512).logprobs == 20
    assert parse_chat({"messages": MESSAGES, "logprobs": False, "top_logprobs": 0}, 512).logprobs is None
    r = parse_completion({"prompt": "x", "logprobs": 0, "echo": True, "max_tokens": 0}, 512)
    assert (r.logprobs, r.echo, r.max_tokens) == (0, True, 0)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": MESSAGES, "logprobs": 1}, "logprobs"),
        ({"messages": MESSAGES, "echo": True}, "echo"),
    ],
)
def test_chat_bounds_are_refused_by_name(body, param):
    with pytest.raises(BadRequest) as e:
        parse_chat(body, 512)
    assert e.value.param == param
