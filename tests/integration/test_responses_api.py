"""OpenAI's Responses API with the official `openai` client, against the real daemon and llama.cpp engine on a tiny model.

The model's chat template writes the tools it is offered and every message
(tool calls and tool results included) into the prompt, so prompt token counts
show what the translation sent.
"""

import json

import httpx
import openai
import pydantic
import pytest

from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

MODEL = "responses-tiny:f32"
TEMPLATE = (
    "{%- if tools %}{{- 'Tools: ' + (tools | tojson) + '\n' }}{%- endif %}"
    "{%- for m in messages %}{{- m.role + ': ' }}{{- m.content if m.content else '' }}"
    "{%- if m.tool_calls %}{{- ' calls ' + (m.tool_calls | tojson) }}{%- endif %}{{- '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city.",
    # an enum keeps a random tiny model's forced arguments short (a free string runs to max_output_tokens)
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"],
    },
}
EXPECTED_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("responses")
    model = make_tiny_gguf(folder / "responses.gguf", seed=11, chat_template=TEMPLATE)
    running = start_daemon(folder)
    try:
        import_model(running, model, MODEL)
        yield running
    finally:
        running.stop()


def _key(box, name: str) -> tuple[int, str]:
    with box.admin() as admin:
        created = admin.post("/admin/keys/", json={"name": name})
        created.raise_for_status()
        return created.json()["id"], created.json()["secret"]


@pytest.fixture(scope="module")
def owner(box):
    return _key(box, "responses-owner")


@pytest.fixture(scope="module")
def client(box, owner):
    return openai.OpenAI(base_url=box.url + "/v1", api_key=owner[1], max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def stranger(box):
    return openai.OpenAI(base_url=box.url + "/v1", api_key=_key(box, "responses-stranger")[1], max_retries=0, timeout=300)


def _collapse(types: list[str]) -> list[str]:
    """Event types with runs of the same type collapsed (deltas come in any number)."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def test_streamed_text_equals_the_plain_text_and_events_come_in_openais_order(client):
    ask = {"model": MODEL, "input": "Streamed or plain: tell a story.", "max_output_tokens": 12, "temperature": 0}
    plain = client.responses.create(**ask)
    assert plain.status in ("completed", "incomplete") and plain.output_text, plain
    events = list(client.responses.create(**ask, stream=True))
    types = [e.type for e in events]
    assert _collapse(types) == EXPECTED_EVENTS + [f"response.{plain.status}"], types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == plain.output_text
    final = events[-1].response
    assert final.id == events[0].response.id and final.id.startswith("resp_") and final.output_text == plain.output_text
    assert final.usage.input_tokens == plain.usage.input_tokens > 0
    assert final.usage.output_tokens == plain.usage.output_tokens > 0
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


class Verdict(pydantic.BaseModel):
    ok: bool


def test_the_stream_helper_accumulates_and_parses_the_final_response(client):
    # a JSON schema answer ends when its object closes, so the stream ends with response.completed
    with client.responses.stream(
        model=MODEL, input="The stream helper: is it fine?", text_format=Verdict, temperature=0, max_output_tokens=40
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and final.output_text == "".join(deltas)
    assert final.status == "completed" and final.output[0].type == "message" and final.output[0].status == "completed"
    assert isinstance(final.output_parsed, Verdict)
    assert final.usage.output_tokens > 0 and final.usage.total_tokens > final.usage.output_tokens


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model=MODEL, input="Remember the code 4417.", max_output_tokens=6, temperature=0)
    follow = {"model": MODEL, "input": "What was the code?", "max_output_tokens": 6, "temperature": 0}
    fresh = client.responses.create(**follow)
    second = client.responses.create(**follow, previous_response_id=first.id)
    # the follow-up's prompt holds the first turn (its input and its answer) before the new input
    assert second.usage.input_tokens > fresh.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    third = list(
        client.responses.create(
            model=MODEL, input="And again?", max_output_tokens=4, temperature=0, stream=True, previous_response_id=second.id
        )
    )[-1].response
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # the stored response reads back as it was answered, with the items it answered
    stored = client.responses.retrieve(first.id)
    assert (
        stored.id == first.id
        and stored.output_text == first.output_text
        and stored.usage.input_tokens == first.usage.input_tokens
    )
    items = client.responses.input_items.list(second.id).data
    assert [item.type for item in items] == ["message", "message", "message"]
    assert items[0].content[0].text == "Remember the code 4417." and items[-1].content[0].text == "What was the code?"
    streamed = client.responses.retrieve(third.id)  # a streamed response is stored before response.completed is sent
    assert streamed.output_text == third.output_text


def test_another_keys_response_is_not_found_and_deleting_is_for_the_owner(client, stranger):
    mine = client.responses.create(model=MODEL, input="Private turn.", max_output_tokens=4, temperature=0)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.create(model=MODEL, input="Continue it.", max_output_tokens=4, previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.input_items.list(mine.id)
    assert client.responses.retrieve(mine.id).id == mine.id  # untouched by the attempts
    client.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Continue it.", max_output_tokens=4, previous_response_id=mine.id)


def test_store_false_is_not_kept(client):
    plain = client.responses.create(model=MODEL, input="Do not keep this.", max_output_tokens=4, temperature=0, store=False)
    streamed = list(
        client.responses.create(model=MODEL, input="Nor this.", max_output_tokens=4, temperature=0, store=False, stream=True)
    )[-1].response
    assert plain.store is False and streamed.store is False
    for response_id in (plain.id, streamed.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, input="Continue.", max_output_tokens=4, previous_response_id=response_id)


def test_responses_are_metered_on_the_key(box):
    key_id, secret = _key(box, "responses-metered")
    metered = openai.OpenAI(base_url=box.url + "/v1", api_key=secret, max_retries=0, timeout=300)
    plain = metered.responses.create(model=MODEL, input="Meter this one.", max_output_tokens=5, temperature=0.7, top_p=0.9)
    streamed = list(
        metered.responses.create(model=MODEL, input="And this one.", max_output_tokens=5, temperature=0.7, stream=True)
    )[-1].response
    with box.admin() as admin:
        totals = admin.get("/admin/usage", params={"key": str(key_id)}).json()["totals"]
    assert totals["requests"] == 2 and totals["failed"] == 0, totals
    assert totals["prompt_tokens"] == plain.usage.input_tokens + streamed.usage.input_tokens
    assert totals["completion_tokens"] == plain.usage.output_tokens + streamed.usage.output_tokens


def test_instructions_and_input_parts_reach_the_model(client):
    bare = client.responses.create(model=MODEL, input="Hello parts.", max_output_tokens=2, temperature=0)
    parts = client.responses.create(
        model=MODEL,
        instructions="Answer as a pirate, in one short line.",
        max_output_tokens=2,
        temperature=0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "parts."}]}],
    )
    assert parts.usage.input_tokens > bare.usage.input_tokens
    assert parts.instructions == "Answer as a pirate, in one short line."


def test_function_tools_and_call_outputs_reach_the_template(client):
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"},
    ]
    ask = {"model": MODEL, "max_output_tokens": 2, "temperature": 0}
    without_tools = client.responses.create(**ask, input=conversation[:1])
    offered = client.responses.create(**ask, input=conversation[:1], tools=[WEATHER])
    declined = client.responses.create(**ask, input=conversation[:1], tools=[WEATHER], tool_choice="none")
    answered = client.responses.create(**ask, input=conversation, tools=[WEATHER])
    assert offered.usage.input_tokens > without_tools.usage.input_tokens == declined.usage.input_tokens
    assert answered.usage.input_tokens > offered.usage.input_tokens  # the call and its output are in the prompt
    assert offered.tools[0].name == "get_weather"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "not_offered"}}, "tool_choice"),
        ({"input": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}, "input"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(box, owner, body, param):
    with box.client(owner[1]) as http:
        r = http.post("/v1/responses", json={"model": MODEL, "input": "x", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_json_schema_text_format_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    response = client.responses.create(
        model=MODEL,
        input="Is it fine?",
        temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}},
    )
    assert response.status == "completed", response
    assert isinstance(json.loads(response.output_text)["ok"], bool)


def test_unknown_response_ids_are_not_found_with_an_openai_error(box, owner):
    with box.client(owner[1]) as http:
        r = http.get("/v1/responses/resp_does_not_exist")
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", r.text
        r = http.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_1"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id", r.text
    assert httpx.get(box.url + "/v1/responses/resp_1").status_code == 401


# Function calls parsed out of the model's answer need the llama.cpp engine to return OpenAI `tool_calls` and to
# honour a named tool_choice (it then constrains the answer to a call of that function).
def test_function_call_round_trip(client):
    called = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        temperature=0,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls, called.output
    call = calls[0]
    assert call.name == "get_weather" and call.id.startswith("fc_") and call.call_id
    assert isinstance(json.loads(call.arguments), dict)
    answered = client.responses.create(
        model=MODEL,
        previous_response_id=called.id,
        tools=[WEATHER],
        max_output_tokens=4,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
    )
    assert answered.status in ("completed", "incomplete")
    assert answered.usage.input_tokens > called.usage.input_tokens
    events = list(
        client.responses.create(
            model=MODEL,
            input="Weather in Rome?",
            tools=[WEATHER],
            temperature=0,
            stream=True,
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=64,
        )
    )
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types, types
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert added.item.name == "get_weather" and done.item_id == added.item.id
    assert isinstance(json.loads(done.arguments), dict)
    final = events[-1].response
    assert any(item.type == "function_call" and item.arguments == done.arguments for item in final.output)
