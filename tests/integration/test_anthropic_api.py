"""The official `anthropic` client, unmodified, against the real daemon and the real llama.cpp engine (/v1/messages)."""

import json
import sqlite3

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.slow

FRESH = {"Cache-Control": "no-cache"}  # every answer comes from the engine, not the response cache
# Current Anthropic clients no longer name the sampling fields; they travel as extra body fields.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def key(daemon):
    return daemon.create_key("anthropic-client")


@pytest.fixture(scope="module")
def client(daemon, key):
    return anthropic.Anthropic(base_url=daemon.url, api_key=key, max_retries=0, timeout=300)


def _ledger(daemon, request_id: str) -> tuple[str, int, int, int]:
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")
    try:
        rows = conn.execute(
            "SELECT endpoint, prompt_tokens, completion_tokens, status FROM usage WHERE request_id = ?", (request_id,)
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) == 1, rows
    return rows[0]


def _text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_message(client):
    reply = client.messages.create(model="default", max_tokens=16, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH)
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.id.startswith("msg_")
    assert reply.model == "gemma-3-270m:q4_k_m"
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    assert _text(reply)


def test_usage_equals_the_ledger_row_of_the_key(client, daemon, key):
    raw = client.messages.with_raw_response.create(
        model="default", max_tokens=12, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH
    )
    reply = raw.parse()
    endpoint, prompt, completion, status = _ledger(daemon, raw.headers["x-request-id"])
    assert (endpoint, status) == ("messages", 200)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (prompt, completion)
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")
    try:
        owner = conn.execute(
            "SELECT k.prefix FROM usage u JOIN api_keys k ON k.id = u.key_id WHERE u.request_id = ?",
            (raw.headers["x-request-id"],),
        ).fetchone()
    finally:
        conn.close()
    assert owner == (key[:12],)


def test_stream_reassembles_to_the_plain_answer(client):
    plain = client.messages.create(model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH)
    kinds = []
    with client.messages.stream(
        model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        streamed = stream.get_final_message()
    assert _text(streamed) == _text(plain)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert streamed.stop_reason == plain.stop_reason
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert streamed.usage.input_tokens == plain.usage.input_tokens > 0


def test_stream_text_deltas_in_raw_events(client):
    deltas = []
    with client.messages.create(
        model="default", max_tokens=8, messages=QUESTION, extra_body=GREEDY, stream=True, extra_headers=FRESH
    ) as events:
        for event in events:
            if event.type == "content_block_delta":
                assert event.delta.type == "text_delta"
                deltas.append(event.delta.text)
            if event.type == "message_delta":
                assert event.usage.output_tokens > 0
    assert "".join(deltas)


def test_system_prompt_changes_the_answer_and_is_billed(client):
    without = client.messages.create(model="default", max_tokens=8, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH)
    with_system = client.messages.create(
        model="default",
        max_tokens=8,
        messages=QUESTION,
        extra_body=GREEDY,
        extra_headers=FRESH,
        system="You answer in French, in one word, and never list anything.",
    )
    blocks = client.messages.create(
        model="default",
        max_tokens=8,
        messages=QUESTION,
        extra_body=GREEDY,
        extra_headers=FRESH,
        system=[
            {
                "type": "text",
                "text": "You answer in French, in one word, and never list anything.",
                "cache_control": {"type": "ephemeral"},
            }
        ],
    )
    assert with_system.usage.input_tokens > without.usage.input_tokens
    assert blocks.usage.input_tokens == with_system.usage.input_tokens
    assert _text(blocks) == _text(with_system)


def test_stop_sequences(client):
    plain = client.messages.create(model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH)
    text = _text(plain)
    words = [w for w in text.split() if len(w) > 2]
    assert len(words) >= 2, text
    stop = words[1]
    cut = client.messages.create(
        model="default",
        max_tokens=24,
        messages=QUESTION,
        extra_body=GREEDY,
        extra_headers=FRESH,
        stop_sequences=[stop, "never-seen-here"],
    )
    assert cut.stop_reason == "stop_sequence"
    assert cut.stop_sequence == stop
    assert _text(cut) == text[: text.index(stop)]
    with client.messages.stream(
        model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH, stop_sequences=[stop]
    ) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence, _text(streamed)) == ("stop_sequence", stop, _text(cut))


def test_cached_answers_are_the_same_message_plain_and_streamed(client, daemon):
    prompt = [{"role": "user", "content": "List four fruits."}]
    plain = client.messages.create(model="default", max_tokens=20, messages=prompt, extra_body=GREEDY, extra_headers=FRESH)
    words = [w for w in _text(plain).split() if len(w) > 2]
    stop = words[1] if len(words) > 1 else None
    fields = {
        "model": "default",
        "max_tokens": 20,
        "messages": prompt,
        "extra_body": GREEDY,
        "stop_sequences": [stop] if stop else [],
    }
    first = client.messages.with_raw_response.create(**fields)  # computed (and stored)
    again = client.messages.with_raw_response.create(**fields)  # from the response cache
    assert again.headers["x-cache"] == "exact"
    cached = again.parse()
    assert (cached.content, cached.stop_reason, cached.stop_sequence) == (
        first.parse().content,
        first.parse().stop_reason,
        first.parse().stop_sequence,
    )
    assert cached.usage.input_tokens == first.parse().usage.input_tokens
    with client.messages.stream(**fields) as stream:
        replayed = stream.get_final_message()
        assert stream.response.headers["x-cache"] == "exact"
    assert (_text(replayed), replayed.stop_reason, replayed.stop_sequence) == (
        _text(cached),
        cached.stop_reason,
        cached.stop_sequence,
    )
    assert _ledger(daemon, again.headers["x-request-id"])[0] == "messages"


def test_max_tokens_is_the_stop_reason(client):
    reply = client.messages.create(
        model="default",
        max_tokens=3,
        extra_body=GREEDY,
        extra_headers=FRESH,
        messages=[{"role": "user", "content": "Write a long story about the sea."}],
    )
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 3


def test_wrong_key_is_authentication_error(daemon):
    bad = anthropic.Anthropic(base_url=daemon.url, api_key="ak_not-a-real-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="default", max_tokens=4, messages=QUESTION)
    assert info.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "Invalid API key."}}


def test_unknown_model_is_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in info.value.body["error"]["message"]


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"max_tokenz": 4}, "max_tokenz"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"temperature": 1.5}, "temperature"),
    ],
)
def test_refused_fields_are_400_in_anthropic_shape(client, extra, named):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="default", max_tokens=4, messages=QUESTION, extra_body=extra)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert named in info.value.body["error"]["message"]


def test_image_blocks_are_refused(client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="default",
            max_tokens=4,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}],
        )
    assert "Image content blocks are not supported" in info.value.body["error"]["message"]


def test_ignored_fields_do_not_change_the_answer(client):
    plain = client.messages.create(model="default", max_tokens=6, messages=QUESTION, extra_body=GREEDY, extra_headers=FRESH)
    reply = client.messages.create(
        model="default",
        max_tokens=6,
        messages=QUESTION,
        extra_body=GREEDY,
        extra_headers=FRESH,
        thinking={"type": "disabled"},
        metadata={"user_id": "someone"},
        service_tier="auto",
        output_config={"effort": "low"},
        cache_control={"type": "ephemeral"},
    )
    assert (_text(reply), reply.usage.input_tokens) == (_text(plain), plain.usage.input_tokens)


def test_sampling_fields_change_the_answer(client):
    prompt = [{"role": "user", "content": "Write one sentence about the sea."}]
    greedy = client.messages.create(model="default", max_tokens=16, messages=prompt, extra_body=GREEDY, extra_headers=FRESH)
    top_k_1 = client.messages.create(
        model="default", max_tokens=16, messages=prompt, extra_headers=FRESH, extra_body={"temperature": 1.0, "top_k": 1}
    )
    assert _text(top_k_1) == _text(greedy)  # one candidate left: the greedy answer at any temperature
    sampled = {
        _text(
            client.messages.create(
                model="default",
                max_tokens=16,
                messages=prompt,
                extra_headers=FRESH,
                extra_body={"temperature": 1.0, "top_p": 1.0, "top_k": 0},
            )
        )
        for _ in range(4)
    }
    assert len(sampled) > 1


def test_output_format_constrains_the_answer_to_the_schema(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    reply = client.messages.create(
        model="default",
        max_tokens=48,
        messages=QUESTION,
        extra_body=GREEDY,
        extra_headers=FRESH,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert set(json.loads(_text(reply))) == {"colour"}


def test_count_tokens_equals_the_billed_prompt(client):
    system = "Be brief."
    counted = client.messages.count_tokens(model="default", messages=QUESTION, system=system)
    reply = client.messages.create(
        model="default", max_tokens=2, messages=QUESTION, system=system, extra_body=GREEDY, extra_headers=FRESH
    )
    assert counted.input_tokens == reply.usage.input_tokens > 0


def test_x_api_key_and_bearer_both_authenticate(daemon, key):
    body = {"model": "default", "max_tokens": 2, "messages": QUESTION, "temperature": 0}
    for headers in ({"x-api-key": key, "anthropic-version": "2023-06-01"}, {"Authorization": f"Bearer {key}"}):
        response = httpx.post(daemon.url + "/v1/messages", json=body, headers=headers, timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["type"] == "message"


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_tool_use_round_trip(client):
    """Forced tool use, the call answered with a tool_result, and the model's final text (needs the engine's
    tool-call parsing)."""
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.messages.create(
        model="default",
        max_tokens=64,
        extra_body=GREEDY,
        extra_headers=FRESH,
        messages=[question],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert first.stop_reason == "tool_use"
    calls = [block for block in first.content if block.type == "tool_use"]
    assert calls and calls[0].name == "get_weather" and isinstance(calls[0].input, dict)
    with client.messages.stream(
        model="default",
        max_tokens=64,
        extra_body=GREEDY,
        extra_headers=FRESH,
        messages=[question],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        streamed = stream.get_final_message()
    streamed_calls = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed.stop_reason == "tool_use" and streamed_calls[0].input == calls[0].input
    final = client.messages.create(
        model="default",
        max_tokens=16,
        extra_body=GREEDY,
        extra_headers=FRESH,
        tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 24 °C"}]},
        ],
    )
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert final.usage.input_tokens > first.usage.input_tokens
