"""The Responses API's request → chat and chat → response translation (pure)."""

import msgspec
import pytest

from appliance.errors import BadRequest
from appliance.openai_schema import ChatCompletionRequest, ResponsesRequest
from appliance.serving.responses.translate import (
    ResponseHead,
    chat_messages,
    chat_request,
    chat_tool_choice,
    chat_tools,
    completed_response,
    input_items,
    response_usage,
)


def _request(**fields) -> ResponsesRequest:
    return msgspec.convert({"model": "default", "input": "hi", **fields}, ResponsesRequest)


def _chat(**fields):
    body = _request(**fields)
    return msgspec.to_builtins(chat_request(body, input_items(body.input)))


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}

# A chat completion answered with a tool call, as OpenAI, vLLM and llama-server shape it.
RECORDED_TOOL_ANSWER = {
    "id": "chatcmpl-7f3a",
    "object": "chat.completion",
    "created": 1764851000,
    "model": "qwen3:q4_k_m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_9xk", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 181,
        "completion_tokens": 19,
        "total_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 128},
    },
}
# A plain answer from the llama.cpp engine, cut at max_tokens.
RECORDED_TEXT_ANSWER = {
    "id": "chatcmpl-1b2c",
    "object": "chat.completion",
    "created": 1764851001,
    "model": "gemma-3-270m:q4_k_m",
    "choices": [
        {"index": 0, "finish_reason": "length", "logprobs": None, "message": {"role": "assistant", "content": "Hello there, how"}}
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
}


def test_string_input_instructions_and_sampling_become_a_chat_request():
    chat = _chat(instructions="Be brief.", max_output_tokens=20, temperature=0.2, top_p=0.9)
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (20, 0.2, 0.9)
    assert "stream" not in chat and "tools" not in chat


def test_streamed_requests_ask_for_usage():
    chat = _chat(stream=True)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_message_items_with_text_parts_are_joined_and_roles_kept():
    items = input_items(
        [
            {"role": "developer", "content": "Answer in French."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "hi"}],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Salut", "annotations": []}]},
        ]
    )
    assert chat_messages(items, None) == [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Salut"},
    ]
    assert items[2]["content"] == [{"type": "output_text", "text": "Salut"}]


def test_function_calls_and_outputs_become_assistant_tool_calls_and_tool_messages():
    items = input_items(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {
                "type": "function_call",
                "call_id": "call_b",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_a", "output": "18 C"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "21 C"}]},
        ]
    )
    messages = chat_messages(items, None)
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "21 C"},
    ]


def test_a_call_after_assistant_text_joins_that_turn():
    items = input_items(
        [
            {"role": "assistant", "content": "Let me look."},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        ]
    )
    assert chat_messages(items, None) == [
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]


@pytest.mark.parametrize(
    "item",
    [
        {"type": "item_reference", "id": "msg_1"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
        {"type": "function_call", "call_id": "c"},
        {"content": "no role"},
        {"role": "tool", "content": "x"},
    ],
)
def test_unserved_input_items_are_a_400_naming_input(item):
    with pytest.raises(BadRequest) as info:
        input_items([item])
    assert info.value.param == "input"


def test_function_tools_become_chat_tools():
    chat = _chat(tools=[WEATHER])
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city.",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert "tool_choice" not in chat  # auto: what chat does without one


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter"},
        {"type": "function"},
        {"type": "function", "name": 3},
    ],
)
def test_other_tools_are_a_400_naming_tools(tool):
    with pytest.raises(BadRequest) as info:
        _chat(tools=[tool])
    assert info.value.param == "tools"


def test_tool_choice_none_keeps_the_tools_away_and_named_choices_take_chat_shape():
    assert "tools" not in _chat(tools=[WEATHER], tool_choice="none")
    body = _request(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    assert chat_tool_choice(body.tool_choice, chat_tools(body.tools)) == {"type": "function", "function": {"name": "get_weather"}}
    assert chat_tool_choice("required", []) == "required"


@pytest.mark.parametrize(
    "choice", [{"type": "function", "name": "not_a_tool"}, {"type": "web_search"}, {"type": "allowed_tools", "tools": []}]
)
def test_bad_tool_choices_are_a_400_naming_tool_choice(choice):
    with pytest.raises(BadRequest) as info:
        _chat(tools=[WEATHER], tool_choice=choice)
    assert info.value.param == "tool_choice"


def test_a_tool_choice_the_chat_schema_refuses_is_refused_by_its_responses_name():
    try:
        msgspec.convert(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, ChatCompletionRequest
        )
    except msgspec.ValidationError:
        with pytest.raises(BadRequest) as info:
            _chat(tools=[WEATHER], tool_choice="required")
        assert info.value.param == "tool_choice"
    else:  # the engines serve required: it reaches chat as it is
        assert _chat(tools=[WEATHER], tool_choice="required")["tool_choice"] == "required"


def test_text_format_becomes_response_format():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    chat = _chat(text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    assert _chat(text={"format": {"type": "json_object"}})["response_format"] == {"type": "json_object"}
    assert "response_format" not in _chat(text={"format": {"type": "text"}})


@pytest.mark.parametrize(
    "text",
    [{"format": {"type": "json_schema", "name": "x"}}, {"format": {"type": "grammar"}}, {"verbosity": "low"}, {"format": "json"}],
)
def test_unserved_text_options_are_a_400_naming_text(text):
    with pytest.raises(BadRequest) as info:
        _chat(text=text)
    assert info.value.param == "text"


def test_unknown_fields_are_refused_by_the_schema():
    for field, value in (("reasoning", {"effort": "high"}), ("truncation", "auto"), ("include", ["x"])):
        with pytest.raises(msgspec.ValidationError, match=field):
            _request(**{field: value})


def test_a_tool_call_answer_becomes_function_call_items():
    head = ResponseHead.of(_request(tools=[WEATHER]), "resp_1", 1764851000)
    response = completed_response(head, RECORDED_TOOL_ANSWER)
    assert response["status"] == "completed" and response["model"] == "qwen3:q4_k_m"
    [call] = response["output"]
    assert call["type"] == "function_call" and call["id"].startswith("fc_") and call["call_id"] == "call_9xk"
    assert (call["name"], call["arguments"], call["status"]) == ("get_weather", '{"city": "Paris"}', "completed")
    assert response["usage"] == {
        "input_tokens": 181,
        "input_tokens_details": {"cached_tokens": 128},
        "output_tokens": 19,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 200,
    }
    assert response["tools"] == [WEATHER] and response["tool_choice"] == "auto"


def test_a_length_stop_is_incomplete_and_the_text_is_one_message():
    head = ResponseHead.of(_request(max_output_tokens=4), "resp_2", 1764851001)
    response = completed_response(head, RECORDED_TEXT_ANSWER)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["id"].startswith("msg_")
    assert message["content"] == [{"type": "output_text", "text": "Hello there, how", "annotations": [], "logprobs": []}]
    assert response["max_output_tokens"] == 4 and response["id"] == "resp_2" and response["object"] == "response"


def test_usage_without_details_or_total():
    assert response_usage({"prompt_tokens": 3, "completion_tokens": 2})["total_tokens"] == 5
    assert response_usage(None)["input_tokens"] == 0


def test_reasoning_comes_back_as_an_item_and_is_not_sent_to_the_model_again():
    answer = {
        **RECORDED_TEXT_ANSWER,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "4", "reasoning_content": "2 plus 2 is 4."},
            }
        ],
    }
    response = completed_response(ResponseHead.of(_request(), "resp_r", 1), answer)
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "2 plus 2 is 4."}]
    assert message["content"][0]["text"] == "4"
    # the output fed back as input (by hand or through previous_response_id): the reasoning is dropped, the answer kept
    items = input_items([{"role": "user", "content": "2+2?"}, *response["output"]])
    assert [item["type"] for item in items] == ["message", "reasoning", "message"]
    assert chat_messages(items, None) == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert chat_messages(
        [{"role": "user", "content": [{"type": "input_text", "text": "x"}], "type": "message"}, reasoning], None
    ) == [{"role": "user", "content": "x"}]
