"""What the gateway forwards to engines: served fields kept, ignored fields dropped, unknown fields refused."""

import msgspec
import pytest

from appliance.cache.keys import normalized
from appliance.errors import BadRequest
from appliance.openai_schema import (
    NOT_FORWARDED,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
    for_engine,
    with_tool_choice_settled,
)

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
EXTRA = {
    "user": "u",
    "metadata": {"a": "b"},
    "store": True,
    "service_tier": "auto",
    "parallel_tool_calls": False,
    "prompt_cache_key": "p",
    "safety_identifier": "s",
}


def _chat(**fields):
    return msgspec.convert({**BASE, **fields}, ChatCompletionRequest)


def test_ignored_fields_never_reach_the_engine_and_served_ones_do():
    body = _chat(chat_template_kwargs={"enable_thinking": False}, top_k=5, logprobs=False, top_logprobs=0, **EXTRA)
    sent = msgspec.json.decode(msgspec.json.encode(for_engine(body, model="served:q4")))
    assert not set(sent) & set(NOT_FORWARDED), sent
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and sent["top_k"] == 5
    assert sent["model"] == "served:q4" and body.model == "m"


def test_ignored_fields_are_not_part_of_the_cache_key():
    assert normalized(_chat(**EXTRA, logprobs=False, modalities=["text"])) == normalized(_chat())
    assert normalized(_chat(chat_template_kwargs={"x": 1})) != normalized(_chat())


@pytest.mark.parametrize(
    "struct, body",
    [
        (ChatCompletionRequest, {**BASE, "functions": []}),
        (CompletionRequest, {"model": "m", "prompt": "x", "min_tokens": 4}),
        (EmbeddingRequest, {"model": "m", "input": "x", "normalize": False}),
        (ResponsesRequest, {"model": "m", "input": "x", "reasoning": {"effort": "low"}}),
    ],
)
def test_every_request_body_refuses_unknown_fields(struct, body):
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert(body, struct)


@pytest.mark.parametrize(
    "fields",
    [
        {"top_logprobs": 2},
        {"logprobs": True, "top_logprobs": 21},
        {"tool_choice": {"type": "function"}},
        {"modalities": ["text", "audio"]},
    ],
)
def test_values_that_would_change_the_answer_are_refused(fields):
    with pytest.raises(msgspec.ValidationError):
        _chat(**fields)


TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_choice_is_forwarded_and_keyed(choice):
    body = with_tool_choice_settled(_chat(tools=TOOLS, tool_choice=choice))
    sent = msgspec.json.decode(msgspec.json.encode(for_engine(body, model="served:q4")))
    assert sent["tool_choice"] == choice
    assert normalized(body) != normalized(_chat(tools=TOOLS))


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {"tool_choice": "required"},
        {"tools": [{"type": "function", "function": "get_weather"}], "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
    ],
)
def test_a_forced_tool_choice_that_cannot_be_honoured_is_a_400_naming_it(fields):
    with pytest.raises(BadRequest) as info:
        with_tool_choice_settled(_chat(**fields))
    assert info.value.param == "tool_choice"


def test_auto_and_none_are_settled_for_every_api_alike():
    assert with_tool_choice_settled(_chat(tools=TOOLS, tool_choice="auto")) == _chat(tools=TOOLS)
    assert with_tool_choice_settled(_chat(tools=TOOLS, tool_choice="none")) == _chat()
