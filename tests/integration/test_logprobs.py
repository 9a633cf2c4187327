"""logprobs, top_logprobs and echo through the real daemon and the real llama.cpp engine, with the official `openai` client.

The tiny random-weight model's answers are gibberish but deterministic at
temperature 0, which is all these checks need: the greedy token is the most
likely one, probabilities are a distribution, streamed values equal plain ones,
echo returns the prompt (scored, with its first token null), and the cache
never answers a logprobs request with an answer that has none.
"""

from __future__ import annotations

import math

import openai
import pytest

from tests.reliability.kit import NO_EOS, TINY, start_tiny_daemon

pytestmark = pytest.mark.slow

CHAT = {
    "model": TINY,
    "messages": [{"role": "user", "content": "Name a colour."}],
    "max_tokens": 8,
    "temperature": 0,
    "logit_bias": NO_EOS,
}
PROMPT = {"model": TINY, "prompt": "the model answer", "max_tokens": 6, "temperature": 0, "logit_bias": NO_EOS}


@pytest.fixture(scope="module")
def box(tmp_path_factory, tiny_gguf):
    daemon = start_tiny_daemon(tmp_path_factory.mktemp("logprobs"), tiny_gguf)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def client(box):
    return openai.OpenAI(base_url=box.url + "/v1", api_key=box.create_key("logprobs"), max_retries=0, timeout=300)


def _as_dicts(content) -> list[dict]:
    return [item.model_dump() for item in content]


def assert_same_logprobs(got: list[dict], expected: list[dict]) -> None:
    """Same tokens and bytes, same values up to rounding: a prompt read from the engine's prefix cache (a repeat)
    rounds differently in the last bits than one read whole."""

    def values(items: list[dict]) -> list[float]:
        return [v for d in items for v in (d["logprob"], *(t["logprob"] for t in d["top_logprobs"]))]

    def names(items: list[dict]) -> list:
        return [(d["token"], d["bytes"], [(t["token"], t["bytes"]) for t in d["top_logprobs"]]) for d in items]

    assert names(got) == names(expected)
    assert values(got) == pytest.approx(values(expected), rel=1e-2, abs=1e-2)


def test_chat_logprobs_are_a_distribution_whose_top_is_the_greedy_token(client):
    r = client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=5)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    for item in content:
        assert len(item.top_logprobs) == 5
        best = item.top_logprobs[0]
        assert (best.token, best.bytes) == (item.token, item.bytes), "greedy decoding picks the most likely token"
        assert best.logprob == pytest.approx(item.logprob) and item.logprob <= 0
        assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs), reverse=True)
        assert sum(math.exp(t.logprob) for t in item.top_logprobs) <= 1 + 1e-6
    # the bytes of the tokens are the answer's UTF-8 (a plain chat answer loses its leading whitespace)
    text = b"".join(bytes(item.bytes) for item in content).decode("utf-8", "replace")
    assert text.lstrip() == choice.message.content


def test_chat_streamed_logprobs_equal_the_plain_ones(client):
    plain = client.chat.completions.create(
        **{**CHAT, "messages": [{"role": "user", "content": "Stream it."}]}, logprobs=True, top_logprobs=3
    )
    streamed: list[dict] = []
    text = ""
    for chunk in client.chat.completions.create(
        **{**CHAT, "messages": [{"role": "user", "content": "Stream it."}]}, logprobs=True, top_logprobs=3, stream=True
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                streamed.extend(_as_dicts(choice.logprobs.content))
    assert text == plain.choices[0].message.content
    assert_same_logprobs(streamed, _as_dicts(plain.choices[0].logprobs.content))


def test_chat_without_logprobs_has_none_and_logprobs_without_top_has_empty_lists(client):
    assert client.chat.completions.create(**CHAT).choices[0].logprobs is None
    content = client.chat.completions.create(**CHAT, logprobs=True).choices[0].logprobs.content
    assert len(content) == 8 and all(item.top_logprobs == [] for item in content)


def test_completion_logprobs_list_the_chosen_and_the_most_likely_tokens(client):
    r = client.completions.create(**PROMPT, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    text = r.choices[0].text
    for token, offset in zip(lp.tokens, lp.text_offset, strict=True):  # a byte of a split character is spelled \xNN
        assert "\\x" in token or text[offset : offset + len(token)] == token, (token, offset, text)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == pytest.approx(logprob) and logprob == pytest.approx(max(top.values()))
        assert 3 <= len(top) <= 4 and sum(math.exp(v) for v in top.values()) <= 1 + 1e-6


def test_completion_echo_returns_the_prompt_scored_and_streams_the_same(client):
    plain = client.completions.create(**PROMPT, logprobs=1, echo=True)
    choice = plain.choices[0]
    assert choice.text.startswith(PROMPT["prompt"]) and len(choice.text) > len(PROMPT["prompt"])
    lp = choice.logprobs
    n_prompt = plain.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 6
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "nothing precedes the first prompt token"
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[n_prompt] == len(PROMPT["prompt"]), "the completion's offsets start after the echoed prompt"
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    for chunk in client.completions.create(**PROMPT, logprobs=1, echo=True, stream=True):
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None:
                for name in streamed:
                    streamed[name] += getattr(c.logprobs, name)
    assert text == choice.text
    assert {name: streamed[name] for name in ("tokens", "text_offset")} == {"tokens": lp.tokens, "text_offset": lp.text_offset}
    assert streamed["token_logprobs"][0] is None and streamed["top_logprobs"][0] is None
    assert streamed["token_logprobs"][1:] == pytest.approx(lp.token_logprobs[1:], rel=1e-2, abs=1e-2)
    for top, expected in zip(streamed["top_logprobs"][1:], lp.top_logprobs[1:], strict=True):
        assert top == pytest.approx(expected, rel=1e-2, abs=1e-2)


def test_scoring_a_prompt_with_max_tokens_0(client):
    prompt = "café au lait"  # é is two byte tokens for the tiny model: one character split across tokens
    r = client.completions.create(model=TINY, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and len(choice.logprobs.tokens) == r.usage.prompt_tokens
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    split = tokens.index("\\xc3")
    assert tokens[split + 1] == "\\xa9", tokens
    assert offsets[split] == offsets[split + 1] == prompt.index("é"), "both halves of é start where é does"
    assert offsets == sorted(offsets) and offsets[-1] < len(prompt)
    # scored again while its prompt is still in the engine's KV cache: every position is decoded again
    again = client.completions.create(
        model=TINY, prompt=prompt, max_tokens=0, echo=True, logprobs=0, extra_headers={"cache-control": "no-cache"}
    )
    assert again.choices[0].logprobs.token_logprobs[0] is None
    assert again.choices[0].logprobs.token_logprobs[1:] == pytest.approx(choice.logprobs.token_logprobs[1:], rel=1e-2, abs=1e-2)
    unscored = client.completions.create(model=TINY, prompt=prompt, max_tokens=0, echo=True).choices[0]
    assert unscored.text == prompt and unscored.logprobs is None


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda c: c.chat.completions.create(**CHAT, logprobs=True, top_logprobs=21), "top_logprobs"),
        (lambda c: c.chat.completions.create(**CHAT, top_logprobs=2), "top_logprobs"),
        (lambda c: c.completions.create(**PROMPT, logprobs=6), "logprobs"),
        (lambda c: c.completions.create(**{**PROMPT, "max_tokens": 0}), "max_tokens"),
    ],
)
def test_out_of_bounds_values_are_refused_by_name(client, call, param):
    with pytest.raises(openai.BadRequestError) as info:
        call(client)
    assert info.value.status_code == 400 and info.value.body.get("param") == param, info.value.body


def test_the_cache_keeps_logprobs_apart_and_replays_them(client):
    body = {**CHAT, "messages": [{"role": "user", "content": "Cache me."}]}
    first = client.chat.completions.with_raw_response.create(**body)
    assert first.headers["x-cache"] == "miss"
    asked = client.chat.completions.with_raw_response.create(**body, logprobs=True, top_logprobs=2)
    assert asked.headers["x-cache"] == "miss", "a logprobs request was answered from an answer without logprobs"
    live = asked.parse().choices[0].logprobs.content
    assert len(live) == 8
    again = client.chat.completions.with_raw_response.create(**body, logprobs=True, top_logprobs=2)
    assert again.headers["x-cache"] == "exact"
    assert _as_dicts(again.parse().choices[0].logprobs.content) == _as_dicts(live)  # the cached answer itself
    replayed: list[dict] = []
    for chunk in client.chat.completions.create(**body, logprobs=True, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                replayed.extend(_as_dicts(choice.logprobs.content))
    assert replayed == _as_dicts(live)
