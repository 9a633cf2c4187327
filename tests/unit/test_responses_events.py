"""The Responses stream events made from recorded chat completion streams (pure)."""

import json

import msgspec

from appliance.openai_schema import ResponsesRequest
from appliance.serving.responses.events import StreamTranslator, sse
from appliance.serving.responses.translate import ResponseHead

BASE = {"id": "chatcmpl-5e1", "object": "chat.completion.chunk", "created": 1764851000, "model": "gemma-3-270m:q4_k_m"}


def _chunk(delta=None, finish=None, **extra):
    return {**BASE, "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}], **extra}


USAGE = {**BASE, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}
# The llama.cpp engine's stream for a short answer: role chunk, text chunks, finish chunk, usage chunk.
TEXT_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Hel"}),
    _chunk({"content": "lo"}),
    _chunk({"content": "!"}),
    _chunk(finish="stop"),
    USAGE,
]
# OpenAI's (and vLLM's) shape of a streamed answer with text and two tool calls.
TOOL_STREAM = [
    _chunk({"role": "assistant", "content": "Checking."}),
    _chunk(
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _chunk(
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    ),
    _chunk(finish="tool_calls"),
    USAGE,
]


def _translator(**fields) -> StreamTranslator:
    body = msgspec.convert({"model": "default", "input": "hi", "stream": True, **fields}, ResponsesRequest)
    return StreamTranslator(ResponseHead.of(body, "resp_s", 1764851000))


def _run(stream, **fields):
    translator = _translator(**fields)
    events = translator.start()
    for chunk in stream:
        events += translator.feed(chunk)
    if not translator.failed:
        events += translator.finish()
    return translator, events


def test_a_text_stream_gives_openais_events_in_order_numbered_from_zero():
    _, events = _run(TEXT_STREAM)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    added = events[2]
    assert added["item"]["type"] == "message" and added["item"]["content"] == [] and added["item"]["status"] == "in_progress"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello!"
    assert events[7]["text"] == "Hello!" and events[8]["part"]["text"] == "Hello!"
    assert events[9]["item"]["status"] == "completed" and events[9]["item"]["content"][0]["text"] == "Hello!"
    item_ids = {e.get("item_id") for e in events[3:9]}
    assert item_ids == {added["item"]["id"]}
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["id"] == "resp_s" and final["model"] == "gemma-3-270m:q4_k_m"
    assert final["usage"]["input_tokens"] == 9 and final["usage"]["output_tokens"] == 3 and final["usage"]["total_tokens"] == 12
    assert final["output"] == [events[9]["item"]]


def test_tool_call_deltas_become_function_call_items_after_the_text():
    translator, events = _run(TOOL_STREAM)
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first_call = events[8]
    assert first_call["output_index"] == 1 and first_call["item"]["type"] == "function_call"
    assert first_call["item"]["name"] == "get_weather" and first_call["item"]["call_id"] == "call_a"
    assert first_call["item"]["id"].startswith("fc_")
    assert events[11]["arguments"] == '{"city": "Paris"}' and events[11]["item_id"] == first_call["item"]["id"]
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call", "function_call"]
    assert (output[2]["name"], output[2]["arguments"], output[2]["call_id"]) == ("get_time", "{}", "call_b")
    assert all(item["status"] == "completed" for item in output)
    assert translator.final == events[-1]["response"]


def test_a_length_stop_ends_with_response_incomplete():
    stream = [_chunk({"content": "Once upon"}), _chunk(finish="length"), USAGE]
    _, events = _run(stream, max_output_tokens=3)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_answer_is_an_empty_message_as_in_a_plain_response():
    _, events = _run([_chunk({"role": "assistant", "content": ""}), _chunk(finish="stop"), USAGE])
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""
    assert "response.output_item.added" in [e["type"] for e in events]


def test_an_error_mid_stream_ends_with_error_and_response_failed():
    error = {
        "error": {
            "message": "The engine serving `m` stopped mid-stream.",
            "type": "server_error",
            "param": None,
            "code": "engine_unavailable",
        }
    }
    translator, events = _run([_chunk({"content": "Par"}), error])
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "engine_unavailable" and "stopped" in events[-2]["message"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_unavailable"
    assert failed["output"][0]["content"][0]["text"] == "Par"
    assert translator.failed


def test_events_are_sent_named_by_type():
    event = {"type": "response.output_text.delta", "sequence_number": 4, "delta": "é"}
    raw = sse(event)
    assert raw.startswith(b"event: response.output_text.delta\ndata: ") and raw.endswith(b"\n\n")
    assert json.loads(raw.split(b"data: ", 1)[1]) == event


def test_reasoning_deltas_become_a_reasoning_item_before_the_message():
    stream = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "The user "}),
        _chunk({"reasoning_content": "greets."}),
        _chunk({"content": "Hi!"}),
        _chunk(finish="stop"),
        USAGE,
    ]
    _, events = _run(stream)
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["type"] == "reasoning" and events[5]["text"] == "The user greets."
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user greets."}] and reasoning["status"] == "completed"
    assert message["content"][0]["text"] == "Hi!"
