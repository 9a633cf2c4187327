"""Logprobs from the llama.cpp worker's decode paths: concurrent streams, speculative drafts, grammar sampling.

The worker runs for real as a subprocess with the tiny model. Each path that
draws a token (the chain, drafts verified in one step, a grammar's helper
thread) must report the same log-probabilities as a lone plain request.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from tests.ggufkit import WorkerProcess

NO_EOS = {"2": -100}
PROMPT = {
    "prompt": "the the the model answer the the the model answer the",
    "max_tokens": 24,
    "temperature": 0,
    "logit_bias": NO_EOS,
    "logprobs": 2,
}


def _stream_logprobs(raw: str) -> tuple[str, dict]:
    text, lp = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for block in raw.split("\n\n"):
        if not block.startswith("data: {"):
            continue
        for choice in json.loads(block[6:])["choices"]:
            text += choice.get("text") or ""
            for name, values in (choice.get("logprobs") or {}).items():
                lp[name] += values
    return text, lp


def _same_alternatives(got: dict[str, float], want: dict[str, float]) -> None:
    """The same top alternatives with the same log-probabilities, within batched decoding's rounding.

    Where two candidates for a place nearly tie (the tiny model has many), that rounding may list either
    one, so the ranked values must agree and every token listed by both must agree; another stream's
    alternatives would differ by whole units.
    """
    assert sorted(got.values(), reverse=True) == pytest.approx(sorted(want.values(), reverse=True), rel=1e-2, abs=1e-2)
    for token in got.keys() & want.keys():
        assert got[token] == pytest.approx(want[token], rel=1e-2, abs=1e-2), token


@pytest.fixture(scope="module")
def worker(tiny_gguf, tmp_path_factory):
    with WorkerProcess(tiny_gguf, tmp_path_factory.mktemp("lp") / "w.sock", served_name="tiny", ctx=256, parallel=4) as w:
        yield w


@pytest.fixture(scope="module")
def speculating(tiny_gguf, tmp_path_factory):
    with WorkerProcess(
        tiny_gguf, tmp_path_factory.mktemp("lps") / "w.sock", served_name="tiny", ctx=256, parallel=4, extra=("--spec-ngram", "2")
    ) as w:
        yield w


async def test_concurrent_streams_each_carry_their_own_logprobs(worker):
    prompts = [f"{word} model answer number" for word in ("one", "two", "three", "four")]
    async with worker.client() as c:
        plain = [(await c.post("/v1/completions", json={**PROMPT, "prompt": p})).json()["choices"][0] for p in prompts]
        streams = await asyncio.gather(
            *(c.post("/v1/completions", json={**PROMPT, "prompt": p, "stream": True}) for p in prompts),
            c.post("/v1/completions", json={**PROMPT, "prompt": "no logprobs here", "logprobs": None, "stream": True}),
        )
    # Batched decoding rounds differently from a lone sequence's (a few 1e-3 here); another stream's values
    # would differ by whole units, and its tokens would not match.
    for want, got in zip(plain, streams[:-1], strict=True):  # the last stream asked for no logprobs
        text, lp = _stream_logprobs(got.text)
        expected = want["logprobs"]
        assert text == want["text"] and lp["tokens"] == expected["tokens"] and lp["text_offset"] == expected["text_offset"]
        assert lp["token_logprobs"] == pytest.approx(expected["token_logprobs"], rel=1e-2, abs=1e-2)
        for top, top_expected in zip(lp["top_logprobs"], expected["top_logprobs"], strict=True):
            _same_alternatives(top, top_expected)
    assert '"logprobs":null' in streams[-1].text and '"token_logprobs"' not in streams[-1].text


async def test_speculative_drafts_report_what_plain_decoding_does(worker, speculating):
    # The tiny model falls into a one-token loop after about 20 tokens; a draft needs room for
    # three tokens or more (drivers/llamacpp/speculation.py), so the answer runs on past it.
    body = {**PROMPT, "max_tokens": 32}
    async with worker.client() as plain_c, speculating.client() as spec_c:
        plain = (await plain_c.post("/v1/completions", json=body)).json()["choices"][0]
        drafted = (await spec_c.post("/v1/completions", json=body)).json()["choices"][0]
        stats = (await spec_c.get("/stats")).json()
    assert stats["spec_accepted_total"] > 0, "the prompt must make drafts that are kept"
    assert drafted["text"] == plain["text"]
    assert drafted["logprobs"]["tokens"] == plain["logprobs"]["tokens"]
    # how a prompt is cut into decode steps changes the last digits (steps are paced by time), not more
    assert drafted["logprobs"]["token_logprobs"] == pytest.approx(plain["logprobs"]["token_logprobs"], rel=1e-2, abs=1e-2)


async def test_grammar_sampled_tokens_have_logprobs_plain_and_streamed(worker):
    body = {
        "messages": [{"role": "user", "content": "Give me JSON."}],
        "max_tokens": 12,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 2,
        "repeat_penalty": 1.1,
    }
    async with worker.client() as c:
        plain = (await c.post("/v1/chat/completions", json=body)).json()
        streamed = await c.post("/v1/chat/completions", json={**body, "stream": True})
    choice = plain["choices"][0]
    content = choice["logprobs"]["content"]
    assert content and len(content) <= plain["usage"]["completion_tokens"]
    assert all(math.isfinite(item["logprob"]) and item["logprob"] <= 0 and len(item["top_logprobs"]) == 2 for item in content)
    assert bytes(b for item in content for b in item["bytes"]).decode("utf-8", "replace").lstrip() == choice["message"]["content"]
    chunks = [json.loads(b[6:]) for b in streamed.text.split("\n\n") if b.startswith("data: {")]
    got = [item for ch in chunks for c in ch["choices"] if c.get("logprobs") for item in c["logprobs"]["content"]]
    # the second request reads its prompt from the prefix cache: the last digits may differ
    (got_names, got_values), (names, values) = _names_and_values(got), _names_and_values(content)
    assert got_names == names and got_values == pytest.approx(values, rel=1e-2, abs=1e-2)


def _names_and_values(content: list[dict]) -> tuple[list, list[float]]:
    names = [(d["token"], d["bytes"], [(t["token"], t["bytes"]) for t in d["top_logprobs"]]) for d in content]
    return names, [v for d in content for v in (d["logprob"], *(t["logprob"] for t in d["top_logprobs"]))]
