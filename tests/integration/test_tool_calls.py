"""Tool calls and reasoning through the real daemon and the real llama.cpp engine, with real clients.

The model is a tiny random-weight GGUF whose chat template teaches the Hermes/Qwen
syntax (``<tool_call>…</tool_call>``, ``<tool_response>``): with ``tool_choice``
``required`` or a named function the engine's grammar makes even random weights
answer with a call whose arguments validate against the tool's schema. A second
tiny model's template opens ``<think>`` in the generation prompt, as the R1
distills do, so what it generates is split into reasoning and content.
"""

from __future__ import annotations

import json
from typing import Literal

import jsonschema_rs
import openai
import pytest

from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

HERMES_TEMPLATE = (
    "{%- if tools %}{{- 'Tools: ' + (tools | tojson) + '\n"
    'Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>\n\' }}{%- endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{- 'tool: <tool_response>' + m.content + '</tool_response>\n' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{{- 'assistant: ' }}{%- for c in m.tool_calls %}"
    '{{- \'<tool_call>{"name": "\' + c.function.name + \'", "arguments": \' + (c.function.arguments | tojson)'
    " + '}</tool_call>' }}{%- endfor %}{{- '\n' }}"
    "{%- else %}{{- m.role + ': ' + m.content + '\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)

THINKING_TEMPLATE = (
    "{%- for m in messages %}{{- m.role + ': ' + (m.content.split('</think>')[-1] if m.role == 'assistant'"
    " else m.content) + '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: <think>\n' }}{%- endif %}"
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather forecast for a city.", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tool-calls")
    hermes = make_tiny_gguf(folder / "hermes.gguf", seed=11, ctx=4096, chat_template=HERMES_TEMPLATE)
    thinking = make_tiny_gguf(folder / "thinking.gguf", seed=12, ctx=4096, chat_template=THINKING_TEMPLATE)
    daemon = start_daemon(folder)
    try:
        import_model(daemon, hermes, "hermes-tiny:f32")
        import_model(daemon, thinking, "thinking-tiny:f32")
        yield daemon, daemon.create_key("tools")
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def client(box):
    daemon, key = box
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0, timeout=300)


def _valid(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema_rs.validate(SCHEMAS[name], args)
    return args


def test_required_gets_a_parsed_call_that_validates(client):
    reply = client.chat.completions.create(
        model="hermes-tiny:f32", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS
    _valid(call.function.name, call.function.arguments)
    assert reply.usage.completion_tokens > 0


def test_named_function_streamed_reassembles_into_a_valid_call(client):
    stream = client.chat.completions.create(
        model="hermes-tiny:f32",
        messages=ASK,
        tools=TOOLS,
        max_tokens=200,
        temperature=0.8,
        seed=3,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict] = {}
    finish, usage, content = None, None, ""
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for fragment in choice.delta.tool_calls or []:
                if fragment.index not in calls:  # the first fragment names the call
                    assert fragment.id and fragment.type == "function" and fragment.function.name
                    calls[fragment.index] = {"id": fragment.id, "name": fragment.function.name, "arguments": ""}
                else:
                    assert fragment.id is None and fragment.function.name is None
                calls[fragment.index]["arguments"] += fragment.function.arguments or ""
    assert finish == "tool_calls"
    assert content == ""
    assert list(calls) == [0] and calls[0]["name"] == "get_time"
    assert _valid("get_time", calls[0]["arguments"])["zone"] in ("UTC", "CET")
    assert usage is not None and usage.completion_tokens > 0


def test_a_tool_result_round_trip_is_accepted_and_answered(client):
    first = client.chat.completions.create(
        model="hermes-tiny:f32",
        messages=ASK,
        tools=TOOLS,
        max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = first.choices[0].message.tool_calls[0]
    conversation = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny", "high": 24}'},
    ]
    second = client.chat.completions.create(
        model="hermes-tiny:f32", messages=conversation, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.completion_tokens > 0
    # The call and its result are in the prompt: it is longer than the question's by both.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_langchain_bind_tools_gets_a_parsed_call(box):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_time(zone: Literal["UTC", "CET"]) -> str:
        """The time in a zone."""
        return "12:00"

    daemon, key = box
    llm = ChatOpenAI(
        model="hermes-tiny:f32", base_url=daemon.url + "/v1", api_key=key, max_retries=0, max_tokens=120, temperature=0
    )
    message = llm.bind_tools([get_time], tool_choice="get_time").invoke("What time is it in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "get_time" and call["args"]["zone"] in ("UTC", "CET")
    assert call["id"].startswith("call_")


def test_reasoning_is_split_from_the_answer(client):
    """The template opens <think>; the grammar makes the model close it and answer."""
    answer = "Paris is the capital.</think>It is Paris."
    reply = client.chat.completions.create(
        model="thinking-tiny:f32",
        messages=[{"role": "user", "content": "Capital of France?"}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": [answer]}}},
    )
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == '"Paris is the capital.'
    assert message.content == 'It is Paris."'
    details = reply.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.completion_tokens


def test_reasoning_streamed_and_counted(client):
    stream = client.chat.completions.create(
        model="thinking-tiny:f32",
        messages=[{"role": "user", "content": "Think."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert reasoning and "</think>" not in reasoning
    assert usage.completion_tokens_details.reasoning_tokens > 0
    assert usage.completion_tokens_details.reasoning_tokens <= usage.completion_tokens


def test_the_ledger_records_tool_call_requests(box, client):
    daemon, _ = box
    with daemon.admin() as admin:
        before = admin.get("/admin/usage", params={"model": "hermes-tiny:f32"}).json()["totals"]
        reply = client.chat.completions.create(
            model="hermes-tiny:f32", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0.7, seed=21
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        after = admin.get("/admin/usage", params={"model": "hermes-tiny:f32"}).json()["totals"]
    assert after["requests"] == before["requests"] + 1 and after["failed"] == before["failed"]
    assert after["completion_tokens"] - before["completion_tokens"] == reply.usage.completion_tokens
    assert after["prompt_tokens"] - before["prompt_tokens"] == reply.usage.prompt_tokens


def test_the_default_model_answers_a_named_call_with_valid_arguments(daemon, api_key):
    """A real (base) model, whose template teaches no call syntax: the generic JSON call, enforced."""
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key=api_key, max_retries=0, timeout=300)
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=60,
        temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": city}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema_rs.validate(city, json.loads(call.function.arguments))
