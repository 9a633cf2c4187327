"""The Messages API ↔ chat completions translation: requests, answers and streams (recorded OpenAI shapes)."""

from __future__ import annotations

import json

import msgspec
import pytest

from appliance.errors import BadRequest
from appliance.serving.anthropic.errors import error_type, from_openai
from appliance.serving.anthropic.request import TOOL_ERROR_PREFIX, chat_request, chat_tools
from appliance.serving.anthropic.response import MalformedToolCall, message
from appliance.serving.anthropic.schema import IGNORED, MessagesRequest
from appliance.serving.anthropic.stream import StreamTranslator

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def request(**fields: object) -> MessagesRequest:
    body = {"model": "default", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return msgspec.convert(body, MessagesRequest)


def chat_body(**fields: object) -> dict:
    return msgspec.to_builtins(chat_request(request(**fields)))


# ---------------------------------------------------------------------- requests


def test_plain_fields_carry_over():
    body = chat_body(
        system="Be brief.",
        stop_sequences=["\n\n", "END"],
        temperature=0.2,
        top_p=0.9,
        top_k=5,
        metadata={"user_id": "u"},
        thinking={"type": "disabled"},
        service_tier="auto",
        cache_control={"type": "ephemeral"},
    )
    assert body == {
        "model": "default",
        "max_tokens": 32,
        "stop": ["\n\n", "END"],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 5,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }


def test_system_blocks_join_and_a_stream_asks_for_its_usage():
    body = chat_body(
        system=[{"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Two."}],
        stream=True,
    )
    assert body["messages"][0] == {"role": "system", "content": "One.\nTwo."}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages():
    body = chat_body(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}, "caller": {"type": "direct"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "no data", "is_error": True}],
            },
        ],
    )
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "And tomorrow?"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_2", "content": TOOL_ERROR_PREFIX + "no data"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": WEATHER["input_schema"]},
        }
    ]


def tools_of(**fields: object):
    req = request(tools=[WEATHER], **fields)
    return chat_tools(req.tools, req.tool_choice)


def test_tool_choice_translations():
    tools, choice, parallel = tools_of()
    assert tools and choice is None and parallel is None
    assert tools_of(tool_choice={"type": "auto"})[1:] == (None, None)
    assert tools_of(tool_choice={"type": "auto", "disable_parallel_tool_use": True})[2] is False
    assert tools_of(tool_choice={"type": "any"})[1] == "required"
    assert tools_of(tool_choice={"type": "tool", "name": "get_weather"})[1] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert tools_of(tool_choice={"type": "none"}) == (None, None, None)  # the model is not offered the tools
    assert "tools" not in chat_body(tools=[WEATHER], tool_choice={"type": "none"})


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking", "thinking is not supported"),
        ({"thinking": {"type": "adaptive"}}, "thinking", "thinking is not supported"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]},
            "messages",
            "Image content blocks",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
                    }
                ]
            },
            "messages",
            "Image content blocks",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages",
            "assistant messages",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice", "not in tools"),
        (
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}]},
            "messages",
            "prefill",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "needs tools"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(fields, param, words):
    with pytest.raises(BadRequest) as info:
        chat_request(request(**fields))
    assert info.value.param == param and words in info.value.message


def test_the_translated_body_is_checked_by_the_chat_schema():
    """A forced tool call is served exactly when chat completions serve it: never a silent drop."""
    try:
        body = chat_body(tools=[WEATHER], tool_choice={"type": "any"})
    except BadRequest as refused:
        assert refused.param == "tool_choice" and "not supported" in refused.message
    else:
        assert body["tool_choice"] == "required"


def test_output_format_is_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = chat_body(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}})
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert "response_format" not in chat_body(output_config={"effort": "high"})


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "x"}]},  # max_tokens is required
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "max_tokenz": 4},
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}],
        },
        {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {}, "type": "bash_20250124"}],
        },
    ],
)
def test_the_schema_refuses_unknown_and_out_of_range_fields(body):
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(body, MessagesRequest)


# ----------------------------------------------------------------------- answers


def chat_result(content: str | None, finish: str, tool_calls: list | None = None, stop_reason: str | None = None) -> dict:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish, "logprobs": None}
    if tool_calls:
        choice["message"]["tool_calls"] = tool_calls
    if stop_reason is not None:
        choice["stop_reason"] = stop_reason
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1,
        "model": "gemma-3-270m:q4_k_m",
        "choices": [choice],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18, "prompt_tokens_details": {"cached_tokens": 4}},
    }


def test_a_text_answer():
    assert message(chat_result("Red, green.", "stop")) == {
        "id": "msg_abc123",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Red, green."}],
        "model": "gemma-3-270m:q4_k_m",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


@pytest.mark.parametrize(
    "finish, matched, stops, reason, sequence",
    [
        ("length", None, None, "max_tokens", None),
        ("stop", "END", ["END"], "stop_sequence", "END"),
        ("stop", "END", None, "end_turn", None),  # a stop the client did not ask for is not its stop_sequence
        ("stop", 128001, ["END"], "end_turn", None),  # vLLM names a stop token id the same way
        ("content_filter", None, None, "refusal", None),
    ],
)
def test_stop_reasons(finish, matched, stops, reason, sequence):
    answer = message(chat_result("x", finish, stop_reason=matched), stops)
    assert (answer["stop_reason"], answer["stop_sequence"]) == (reason, sequence)


def test_tool_calls_become_tool_use_blocks():
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}},
    ]
    answer = message(chat_result(None, "tool_calls", calls))
    assert answer["stop_reason"] == "tool_use"
    assert answer["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
    ]
    with_text = message(chat_result("Looking.", "stop", calls[:1]))
    assert [block["type"] for block in with_text["content"]] == ["text", "tool_use"] and with_text["stop_reason"] == "tool_use"


def test_tool_arguments_that_are_not_an_object_are_an_engine_error():
    with pytest.raises(MalformedToolCall):
        message(
            chat_result(None, "tool_calls", [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2"}}])
        )


# ----------------------------------------------------------------------- streams


def sse(*chunks: dict | str) -> bytes:
    return b"".join(b"data: " + (c.encode() if isinstance(c, str) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def chunk(delta: dict, finish: str | None = None, **extra: object) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gemma-3-270m:q4_k_m",
        "choices": [choice],
    }


USAGE = {
    "id": "chatcmpl-s1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "gemma-3-270m:q4_k_m",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}


def events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            name, data = block.split(b"\n")
            assert name.startswith(b"event: ") and data.startswith(b"data: ")
            payload = json.loads(data[6:])
            assert payload["type"] == name[7:].decode()
            out.append((payload["type"], payload))
    return out


def translate(stream: bytes, step: int | None = None, stops: list[str] | None = None) -> list[tuple[str, dict]]:
    """Feed ``stream`` whole, or ``step`` bytes at a time (the translator must not care)."""
    translator = StreamTranslator("default", stops)
    if step is None:
        return events(translator.feed(stream))
    return events(b"".join(translator.feed(stream[i : i + step]) for i in range(0, len(stream), step)))


TEXT_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Red"}),
    chunk({"content": ", blue"}),
    chunk({}, "length"),
    USAGE,
    "[DONE]",
)


@pytest.mark.parametrize("step", [None, 1, 7])
def test_a_text_stream(step):
    got = translate(TEXT_STREAM, step)
    assert [name for name, _ in got] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = got[0][1]["message"]
    assert start["id"] == "msg_s1" and start["model"] == "gemma-3-270m:q4_k_m" and start["content"] == []
    assert got[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(p["delta"]["text"] for n, p in got if n == "content_block_delta") == "Red, blue"
    assert got[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": 9, "output_tokens": 3},
    }


def test_a_stream_stopped_by_a_stop_sequence():
    stream = sse(chunk({"content": "Red"}), chunk({}, "stop", stop_reason="blue"), USAGE, "[DONE]")
    delta = dict(translate(stream, stops=["blue"]))["message_delta"]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "blue"}


def test_a_tool_call_stream():
    """Text, then two tool calls whose arguments arrive in pieces (as llama-server and vLLM stream them)."""
    stream = sse(
        chunk({"role": "assistant", "content": None}),
        chunk({"content": "Checking."}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
        USAGE,
        "[DONE]",
    )
    got = translate(stream, 13)
    starts = [p for n, p in got if n == "content_block_start"]
    assert [s["content_block"] for s in starts] == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}},
        {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}},
    ]
    assert [s["index"] for s in starts] == [0, 1, 2]
    pieces = {
        i: "".join(
            p["delta"]["partial_json"]
            for n, p in got
            if n == "content_block_delta" and p["index"] == i and p["delta"]["type"] == "input_json_delta"
        )
        for i in (1, 2)
    }
    assert json.loads(pieces[1]) == {"city": "Paris"} and json.loads(pieces[2]) == {}
    assert [p["index"] for n, p in got if n == "content_block_stop"] == [0, 1, 2]
    # each block is stopped before the next one starts
    order = [(n, p.get("index")) for n, p in got if n in ("content_block_start", "content_block_stop")]
    assert order == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
    ]
    assert dict(got)["message_delta"]["delta"]["stop_reason"] == "tool_use"


def test_a_cached_replay_with_whole_tool_calls():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    got = translate(
        sse(chunk({"role": "assistant", "content": ""}), chunk({"tool_calls": [call]}), chunk({}, "tool_calls"), USAGE, "[DONE]")
    )
    assert [n for n, _ in got].count("content_block_start") == 1
    assert [p["delta"] for n, p in got if n == "content_block_delta"] == [
        {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    ]


def test_an_error_mid_stream_ends_the_message_with_an_error_event():
    error = {
        "error": {
            "message": "The engine serving `m` stopped mid-stream.",
            "type": "server_error",
            "param": None,
            "code": "engine_unavailable",
        }
    }
    got = translate(sse(chunk({"content": "Red"}), error, "[DONE]"))
    assert [n for n, _ in got] == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert got[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "The engine serving `m` stopped mid-stream."},
    }


def test_an_empty_answer_is_still_a_whole_message():
    got = translate(sse(chunk({"role": "assistant", "content": ""}), chunk({}, "stop"), USAGE, "[DONE]"))
    assert [n for n, _ in got] == ["message_start", "ping", "message_delta", "message_stop"]


def test_error_types_by_status_and_from_openai_errors():
    assert [error_type(s) for s in (400, 401, 403, 404, 413, 429, 500, 503, 504)] == [
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "api_error",
    ]
    assert from_openai({"error": {"type": "rate_limit_error", "message": "slow down"}})["error"] == {
        "type": "rate_limit_error",
        "message": "slow down",
    }


def test_a_chat_schema_refusal_names_the_messages_api_field():
    """Tool results become one chat message each: past the chat schema's 4,096 messages, a 400 naming messages."""
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"} for i in range(2100)]
    with pytest.raises(BadRequest) as info:
        chat_request(
            request(
                messages=[
                    {"role": "user", "content": results},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": results},
                ]
            )
        )
    assert info.value.param == "messages" and "4096" in info.value.message


IGNORED_VALUES = {
    "metadata": {"metadata": {"user_id": "someone"}},
    "cache_control": {
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
        "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
        "tools": [{**WEATHER, "cache_control": {"type": "ephemeral"}}],
    },
    "service_tier": {"service_tier": "standard_only"},
    "output_config.effort": {"output_config": {"effort": "max"}},
    "caller": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}, "caller": {"type": "direct"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
        ]
    },
}


@pytest.mark.parametrize("name", sorted(IGNORED))
def test_every_ignored_field_leaves_the_chat_body_unchanged(name):
    with_it = IGNORED_VALUES[name]
    without = json.loads(
        json.dumps(with_it).replace(', "cache_control": {"type": "ephemeral"}', "").replace(', "caller": {"type": "direct"}', "")
    )
    for field in ("metadata", "cache_control", "service_tier", "output_config"):
        without.pop(field, None)
    assert without != with_it and name.split(".")[0] not in json.dumps(without)
    assert chat_body(**with_it) == chat_body(**without)
