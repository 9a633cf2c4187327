"""Structured output in the llama.cpp worker itself (a real worker process on a tiny GGUF, no gateway in front).

The gateway checks every schema, but the worker is an engine of its own: it checks
the same limits when it parses a request, and refuses what llguidance refuses,
each with a 400 naming the field; what it accepts it serves under the grammar.
"""

from __future__ import annotations

import json

import pytest

from tests.ggufkit import WorkerProcess

BOMB = {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}, "required": ["a"]}
CHOICE = {
    "type": "object",
    "properties": {"pick": {"enum": ["left", "right"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["pick", "n"],
}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}


@pytest.fixture(scope="module")
def worker(tiny_gguf, tmp_path_factory):
    sock = tmp_path_factory.mktemp("ws") / "w.sock"
    with WorkerProcess(tiny_gguf, sock, served_name="tiny", ctx=512, parallel=4, threads=1) as w:
        yield w


async def _post(worker, path: str, body: dict):
    async with worker.client() as c:
        return await c.post(path, json=body, timeout=60)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_sampled_answers_follow_the_schema_and_end_with_it(worker, seed):
    r = await _post(
        worker,
        "/v1/completions",
        {"prompt": "x", "max_tokens": 100, "temperature": 1.0, "seed": seed, "response_format": schema_format(CHOICE)},
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"  # the grammar ended the answer, well before max_tokens
    value = json.loads(choice["text"])
    assert value["pick"] in ("left", "right") and 0 <= value["n"] <= 9 and set(value) == {"pick", "n"}


async def test_grammar_with_penalties_and_logprobs(worker):
    r = await _post(
        worker,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "json"}],
            "max_tokens": 100,
            "temperature": 0.8,
            "seed": 5,
            "repeat_penalty": 1.2,
            "logprobs": True,
            "top_logprobs": 2,
            "response_format": schema_format(CHOICE),
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert json.loads(choice["message"]["content"])["pick"] in ("left", "right")
    assert choice["logprobs"]["content"]


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/completions", {"prompt": "x", "response_format": schema_format(BOMB)}, "response_format", "minLength"),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": BOMB}}],
                "tool_choice": "required",
            },
            "tools",
            "minLength",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": schema_format({"type": "object", "properties": {"a": {"pattern": "(("}}})},
            "response_format",
            "regex",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logit_bias": {str(i): 1 for i in range(1025)}},
            "logit_bias",
            "1024",
        ),
    ],
)
async def test_refusals_name_the_field(worker, path, body, param, words):
    r = await _post(worker, path, {"max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
