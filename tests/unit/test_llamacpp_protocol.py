"""Request parsing (400s name their param) and response shapes."""

from __future__ import annotations

import json

import pytest

from appliance.drivers.llamacpp.grammar import ANY_OBJECT, grammar_for
from appliance.drivers.llamacpp.protocol import DONE, Shaper, parse_chat, parse_completion, usage_dict
from appliance.errors import BadRequest

V = 512


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "x", "stop": 5}, "stop"),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 99999]}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": "x", "response_format": {"type": "xml"}}, "response_format"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
    ],
)
def test_completion_400s(body, param):
    with pytest.raises(BadRequest) as e:
        parse_completion(body, V)
    assert e.value.status == 400 and e.value.param == param


def test_completion_fields():
    r = parse_completion(
        {
            "prompt": "hi",
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stop": "\n",
            "temperature": 0,
            "seed": 3,
            "logit_bias": {"2": -100},
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        V,
    )
    assert r.max_tokens == 7 and r.stop == ["\n"] and r.sampling.greedy and r.sampling.seed == 3
    assert r.sampling.logit_bias == {2: -100.0} and r.stream and r.include_usage
    assert parse_completion({"prompt": [1, 2, 3]}, V).prompt_tokens == [1, 2, 3]
    assert parse_completion({"prompt": ["only one"]}, V).prompt_text == "only one"


def test_chat_fields():
    r = parse_chat(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "response_format": {"type": "json_object"},
        },
        V,
    )
    assert r.kind == "chat" and r.tools and r.sampling.grammar


def test_grammars():
    assert grammar_for(None) is None and grammar_for({"type": "text"}) is None
    assert grammar_for({"type": "json_object"}) == grammar_for({"type": "json_schema", "json_schema": {}}) == ANY_OBJECT
    g = grammar_for(
        {
            "type": "json_schema",
            "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        }
    )
    assert g.startswith("start: %json{") and '"required":["a"]' in g


def test_logit_bias_is_capped():
    with pytest.raises(BadRequest) as info:
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(i): 1 for i in range(1025)}}, 2000)
    assert info.value.param == "logit_bias"
    r = parse_chat({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(i): 1 for i in range(1024)}}, 2000)
    assert len(r.sampling.logit_bias) == 1024


def test_stream_chunks_are_valid_json():
    for kind in ("completion", "chat"):
        s = Shaper(kind, "m")
        chunk = s.chunk('he said "hi"\n€')
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
        obj = json.loads(chunk[6:])
        assert obj["model"] == "m" and obj["choices"][0]["finish_reason"] is None
        text = obj["choices"][0]["delta"]["content"] if kind == "chat" else obj["choices"][0]["text"]
        assert text == 'he said "hi"\n€'
        fin = json.loads(s.final_chunk("length")[6:])
        assert fin["choices"][0]["finish_reason"] == "length"
        u = json.loads(s.usage_chunk(usage_dict(3, 4, 1))[6:])
        assert u["choices"] == [] and u["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 1},
        }
    full = json.loads(Shaper("chat", "m").full("x", "stop", usage_dict(1, 1, 0)))
    assert full["object"] == "chat.completion" and full["choices"][0]["message"] == {"role": "assistant", "content": "x"}
    assert DONE == b"data: [DONE]\n\n"


def test_the_stop_string_that_ended_the_answer_is_named_as_vllm_does():
    shaper = Shaper("chat", "m")
    assert json.loads(shaper.final_chunk("stop", "END")[6:])["choices"][0]["stop_reason"] == "END"
    assert "stop_reason" not in json.loads(shaper.final_chunk("stop")[6:])["choices"][0]
    full = json.loads(shaper.full("x", "stop", usage_dict(1, 1, 0), stop_reason="END"))
    assert full["choices"][0]["stop_reason"] == "END"
    assert "stop_reason" not in json.loads(shaper.full("x", "length", usage_dict(1, 1, 0)))["choices"][0]
