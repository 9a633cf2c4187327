"""The Ollama API's translators: requests to OpenAI-shaped bodies, OpenAI answers and streams back to Ollama's."""

import json

import msgspec
import pytest

from appliance.errors import BadRequest
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest
from appliance.serving.ollama import answers, streams, to_openai
from appliance.serving.ollama.schema import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest


def chat(**fields):
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}, ChatRequest)


def generate(**fields):
    return msgspec.convert({"model": "m", "prompt": "hi", **fields}, GenerateRequest)


def test_options_map_to_sampling_fields():
    body = to_openai.chat_request(
        chat(
            options={
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 20,
                "min_p": 0.05,
                "seed": 7,
                "num_predict": 12,
                "stop": ["\n"],
                "repeat_penalty": 1.1,
                "presence_penalty": 0.5,
                "frequency_penalty": 0.25,
                "num_ctx": 8192,
                "num_thread": 4,
            }
        )
    )
    assert (body.temperature, body.top_p, body.top_k, body.min_p, body.seed) == (0.2, 0.9, 20, 0.05, 7)
    assert body.max_tokens == 12 and body.stop == ["\n"]
    assert (body.repeat_penalty, body.presence_penalty, body.frequency_penalty) == (1.1, 0.5, 0.25)


@pytest.mark.parametrize("num_predict", [-1, -2, 0])
def test_num_predict_without_a_cap(num_predict):
    assert to_openai.chat_request(chat(options={"num_predict": num_predict})).max_tokens is None


def test_stream_is_the_default_and_asks_for_usage():
    body = to_openai.chat_request(chat())
    assert body.stream is True and body.stream_options.include_usage is True
    plain = to_openai.chat_request(chat(stream=False))
    assert plain.stream is False and plain.stream_options is None


@pytest.mark.parametrize("option, value", [("mirostat", 2), ("typical_p", 0.5), ("tfs_z", 0.9), ("repeat_last_n", 128)])
def test_options_the_engines_do_not_serve_are_refused_by_name(option, value):
    with pytest.raises(BadRequest) as info:
        to_openai.chat_request(chat(options={option: value}))
    assert info.value.param == f"options.{option}"
    neutral = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "repeat_last_n": 64}[option]
    to_openai.chat_request(chat(options={option: neutral}))  # the neutral value passes


def test_unknown_option_is_refused():
    with pytest.raises(msgspec.ValidationError, match="unknown field `num_gqa`"):
        chat(options={"num_gqa": 8})


def test_format_json_and_schema():
    assert to_openai.chat_request(chat(format="json")).response_format.type == "json_object"
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    fmt = to_openai.chat_request(chat(format=schema)).response_format
    assert fmt.type == "json_schema" and fmt.json_schema["schema"] == schema
    assert to_openai.chat_request(chat(format="")).response_format is None


def test_think_becomes_the_template_switch():
    assert to_openai.chat_request(chat(think=False)).chat_template_kwargs == {"enable_thinking": False}
    assert to_openai.chat_request(chat(think="high")).chat_template_kwargs == {
        "enable_thinking": True,
        "reasoning_effort": "high",
    }
    assert to_openai.chat_request(chat()).chat_template_kwargs is None


def test_images_and_logprobs_are_refused():
    with pytest.raises(BadRequest) as info:
        to_openai.chat_request(chat(messages=[{"role": "user", "content": "what is this?", "images": ["aGk="]}]))
    assert info.value.param == "images"
    with pytest.raises(BadRequest) as info:
        to_openai.chat_request(chat(logprobs=True))
    assert info.value.param == "logprobs"


def test_tool_history_gets_ids_that_pair_calls_with_answers():
    messages = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "time", "arguments": {"city": "Oslo"}}},
            ],
        },
        {"role": "tool", "tool_name": "time", "content": "10:00"},
        {"role": "tool", "tool_name": "weather", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    body = to_openai.chat_request(chat(messages=messages, tools=tools))
    assistant = body.messages[1]
    assert assistant.content is None
    assert [c["id"] for c in assistant.tool_calls] == ["call_0", "call_1"]
    assert json.loads(assistant.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert [(m.tool_call_id, m.content) for m in body.messages[2:]] == [("call_1", "10:00"), ("call_0", "sunny")]
    assert body.tools == tools
    assert to_openai.chat_request(chat(tools=[])).tools is None  # the official client sends an empty list


def test_generate_is_a_chat_turn_with_the_system_prompt():
    body = to_openai.generate_request(generate(system="Be brief.", options={"num_predict": 5}))
    assert isinstance(body, ChatCompletionRequest)
    assert [(m.role, m.content) for m in body.messages] == [("system", "Be brief."), ("user", "hi")]
    assert body.max_tokens == 5


def test_raw_generate_is_a_completion_without_openai_default_cap():
    body = to_openai.generate_request(generate(raw=True, stream=False))
    assert isinstance(body, CompletionRequest) and body.prompt == "hi" and body.max_tokens is None
    assert to_openai.generate_request(generate(raw=True, options={"num_predict": 3})).max_tokens == 3


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"suffix": "end"}, "suffix"),
        ({"context": [1, 2]}, "context"),
        ({"images": ["aGk="]}, "images"),
        ({"raw": True, "system": "x"}, "system"),
        ({"raw": True, "think": True}, "think"),
    ],
)
def test_generate_refusals_name_the_field(fields, param):
    with pytest.raises(BadRequest) as info:
        to_openai.generate_request(generate(**fields))
    assert info.value.param == param


def test_embed_requests():
    assert to_openai.embed_request(msgspec.convert({"model": "m", "input": ["a", "b"]}, EmbedRequest)).input == ["a", "b"]
    assert to_openai.embed_request(msgspec.convert({"model": "m", "prompt": "a"}, EmbeddingsRequest)).input == "a"
    with pytest.raises(BadRequest) as info:
        to_openai.embed_request(msgspec.convert({"model": "m", "input": "a", "dimensions": 64}, EmbedRequest))
    assert info.value.param == "dimensions"


# Answers as the engines give them (OpenAI's shapes), recorded.
CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gemma-3-270m:q4_k_m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
}
TOOL_ANSWER = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_abc", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
}
TOOL_STREAM = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,'
    b'"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"weather","arguments":""}}]},"finish_reason":null}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"{\\"city\\": "}}]},"finish_reason":null}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"\\"Paris\\"}"}}]},"finish_reason":null}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9,'
    b'"total_tokens":49}}',
    b"data: [DONE]",
]
TEXT_STREAM = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Bl"},'
    b'"finish_reason":null}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ue."},'
    b'"finish_reason":"length"}]}',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,'
    b'"total_tokens":13}}',
    b"data: [DONE]",
]
COMPLETION_STREAM = [
    b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":null}]}',
    b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":".","finish_reason":"stop"}]}',
    b'data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
    b'"total_tokens":7}}',
]


def test_chat_answer_has_ollama_counts_and_durations():
    out = answers.chat_answer(CHAT_ANSWER, "default", answers.Timings(total=900, prompt=0, generation=900))
    assert out["message"] == {"role": "assistant", "content": "Blue."}
    assert out["model"] == "default" and out["done"] is True and out["done_reason"] == "stop"
    assert (out["prompt_eval_count"], out["eval_count"], out["total_duration"], out["eval_duration"]) == (11, 3, 900, 900)
    assert out["created_at"].endswith("Z")


def test_tool_calls_come_back_with_object_arguments():
    out = answers.chat_answer(TOOL_ANSWER, "m", answers.Timings(total=1))
    assert out["message"]["tool_calls"] == [
        {"id": "call_abc", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}}
    ]
    assert out["done_reason"] == "stop" and out["message"]["content"] == ""


def test_streamed_tool_call_fragments_are_joined():
    translator = streams.StreamTranslator("m", chat=True, started_ns=0)
    objects = [obj for i, event in enumerate(TOOL_STREAM) for obj in translator.event(event, 10 + i)] + translator.finish(100)
    assert objects[0]["message"]["tool_calls"][0]["function"] == {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}
    assert objects[0]["done"] is False
    final = objects[-1]
    assert final["done"] is True and (final["prompt_eval_count"], final["eval_count"]) == (40, 9)


def test_streamed_text_reassembles_with_timings():
    translator = streams.StreamTranslator("default", chat=True, started_ns=1_000)
    objects = []
    for now, event in zip((5_000, 6_000, 7_000, 7_500), TEXT_STREAM, strict=True):
        objects += translator.event(event, now)
    objects += translator.finish(8_000)
    assert "".join(o["message"]["content"] for o in objects) == "Blue."
    assert [o["done"] for o in objects] == [False, False, True]
    final = objects[-1]
    assert final["done_reason"] == "length" and final["eval_count"] == 2 and final["prompt_eval_count"] == 11
    assert (final["total_duration"], final["prompt_eval_duration"], final["eval_duration"]) == (7_000, 4_000, 3_000)


def test_streamed_completion_for_generate():
    translator = streams.StreamTranslator("m", chat=False, started_ns=0)
    objects = [obj for event in COMPLETION_STREAM for obj in translator.event(event, 1)] + translator.finish(2)
    assert "".join(o["response"] for o in objects) == " Paris."
    assert objects[-1]["eval_count"] == 2 and "message" not in objects[-1]


def test_streamed_chat_turn_for_generate():
    translator = streams.StreamTranslator("m", chat=False, started_ns=0)
    objects = [obj for event in TEXT_STREAM for obj in translator.event(event, 1)] + translator.finish(2)
    assert "".join(o["response"] for o in objects) == "Blue." and objects[-1]["done"] is True


def test_engine_error_mid_stream_ends_with_an_error_object():
    translator = streams.StreamTranslator("m", chat=True, started_ns=0)
    objects = translator.event(TEXT_STREAM[0], 1)
    objects += translator.event(b'data: {"error": {"message": "The engine stopped.", "type": "server_error"}}', 2)
    objects += translator.finish(3)
    assert objects[-1] == {"error": "The engine stopped."}


def test_embed_answers():
    result = {
        "data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}],
        "usage": {"prompt_tokens": 4},
    }
    out = answers.embed_answer(result, "m", answers.Timings(total=5))
    assert out["embeddings"] == [[1.0, 0.0], [0.0, 1.0]] and out["prompt_eval_count"] == 4
    assert answers.embeddings_answer(result) == {"embedding": [1.0, 0.0]}
