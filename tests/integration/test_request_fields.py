"""No field is dropped in silence: through the real daemon, with the official `openai` client.

A field that would change the answer and is not served gets a 400 whose
``param`` names it; the fields documented as ignored are accepted, do not
change the answer, do not split the cache and never reach the engine.
"""

import httpx
import openai
import pytest

from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

CHAT = {"model": "default", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def client(daemon, api_key):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=api_key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(daemon, api_key):
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300) as c:
        yield c


def _refused(call, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error = info.value.body
    assert info.value.status_code == 400 and error.get("param") == param, f"expected a 400 naming {param}: {error}"
    return error["message"]


def test_chat_logprobs_are_served_and_their_bounds_refused_by_name(client):
    served = client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=2)
    assert len(served.choices[0].logprobs.content) == served.usage.completion_tokens
    _refused(lambda: client.chat.completions.create(**CHAT, logprobs=False, top_logprobs=3), "top_logprobs")
    _refused(lambda: client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=21), "top_logprobs")


def test_completion_logprobs_bounds_suffix_and_best_of_are_refused_by_name(client):
    base = {"model": "default", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    served = client.completions.create(**base, logprobs=2, echo=True)
    assert served.choices[0].text.startswith(base["prompt"]) and served.choices[0].logprobs.token_logprobs[0] is None
    _refused(lambda: client.completions.create(**base, logprobs=6), "logprobs")
    _refused(lambda: client.completions.create(**base, suffix=" the end."), "suffix")
    _refused(lambda: client.completions.create(**base, best_of=3), "best_of")


def test_embedding_dimensions_are_refused_by_name(client):
    _refused(lambda: client.embeddings.create(model="default", input="hello", dimensions=64), "dimensions")


def test_tool_choice_that_cannot_be_honoured_is_refused_by_name(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    message = _refused(
        lambda: client.chat.completions.create(
            **CHAT, tools=tools, tool_choice={"type": "function", "function": {"name": "get_time"}}
        ),
        "tool_choice",
    )
    assert "get_time" in message
    _refused(lambda: client.chat.completions.create(**CHAT, tool_choice="required"), "tool_choice")
    _refused(
        lambda: client.chat.completions.create(
            **CHAT, tools=tools, tool_choice="required", response_format={"type": "json_object"}
        ),
        "tool_choice",
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("function_call", "auto"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("reasoning_effort", "high"),
        ("Temperature", 0.5),
        ("max_tokenz", 3),
        ("store", {}),
        ("metadata", [1]),
    ],
)
def test_unknown_or_unserved_chat_fields_are_refused_by_name(http, field, value):
    r = http.post("/v1/chat/completions", json={**CHAT, field: value})
    assert r.status_code == 400, f"{field} was accepted: {r.status_code} {r.text[:300]}"
    assert r.json()["error"]["param"] == field, r.text


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": "default", "prompt": "Hi", "max_tokens": 2, "guided_json": {}}),
        ("/v1/embeddings", {"model": "default", "input": "hi", "truncate": True}),
        ("/v1/responses", {"model": "default", "input": "hi", "tools": [{"type": "web_search"}]}),
        ("/v1/responses", {"model": "default", "input": "hi", "reasoning": {"effort": "high"}}),
        ("/v1/responses", {"model": "default", "input": "hi", "truncation": "auto"}),
    ],
)
def test_unknown_fields_on_every_endpoint_are_refused_by_name(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code == 400, f"{path} accepted an unknown field: {r.status_code} {r.text[:300]}"
    assert r.json()["error"]["param"] in body and r.json()["error"]["param"] not in ("model", "input", "prompt"), r.text


def test_ignored_fields_are_accepted_and_do_not_change_the_answer_or_split_the_cache(http):
    prompt = {**CHAT, "messages": [{"role": "user", "content": "Ignored fields check: name a fruit."}]}
    plain = http.post("/v1/chat/completions", json=prompt)
    assert plain.status_code == 200, plain.text
    decorated = http.post(
        "/v1/chat/completions",
        json={
            **prompt,
            "user": "end-user-7",
            "metadata": {"ticket": "42"},
            "store": False,
            "service_tier": "auto",
            "parallel_tool_calls": True,
            "prompt_cache_key": "k1",
            "safety_identifier": "s1",
            "logprobs": False,
            "top_logprobs": 0,
            "modalities": ["text"],
            "tool_choice": "auto",
        },
    )
    assert decorated.status_code == 200, decorated.text
    assert decorated.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    assert decorated.headers.get("x-cache") == "exact", "an ignored field split the cache (it must not be part of the key)"


@pytest.fixture(scope="module")
def tools_box(tmp_path_factory):
    """A daemon with a tiny model whose chat template writes the tools it is offered into the prompt."""
    folder = tmp_path_factory.mktemp("tools-template")
    model = make_tiny_gguf(
        folder / "tools.gguf",
        seed=5,
        chat_template=(
            "{%- if tools %}{{- 'Tools: ' + (tools | tojson) + '\n' }}{%- endif %}"
            "{%- for m in messages %}{{- m.role + ': ' + m.content + '\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
        ),
    )
    box = start_daemon(folder)
    try:
        import_model(box, model, "tools-template:f32")
        yield box, box.create_key("tools")
    finally:
        box.stop()


def test_tool_choice_none_keeps_the_tools_away_from_the_model(tools_box):
    box, key = tools_box
    prompt = {**CHAT, "model": "tools-template:f32", "messages": [{"role": "user", "content": "Tool choice none: say yes."}]}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
            },
        }
    ]
    with box.client(key) as http:
        without = http.post("/v1/chat/completions", json=prompt)
        declined = http.post("/v1/chat/completions", json={**prompt, "tools": tools, "tool_choice": "none"})
        offered = http.post("/v1/chat/completions", json={**prompt, "tools": tools, "tool_choice": "auto"})
    assert without.status_code == declined.status_code == offered.status_code == 200, (without.text, declined.text, offered.text)
    # Offering the tools puts them in the prompt; with tool_choice none the prompt is the one without tools.
    assert offered.json()["usage"]["prompt_tokens"] > without.json()["usage"]["prompt_tokens"]
    assert declined.json()["usage"]["prompt_tokens"] == without.json()["usage"]["prompt_tokens"]


def test_ignore_eos_generates_max_tokens_even_when_the_end_is_forced(http):
    """An extension of llama-server and vLLM: declared, so forwarded, and the llama.cpp engine honours it."""
    forced_end = {
        "model": "default",
        "prompt": "The end.",
        "max_tokens": 12,
        "temperature": 0,
        "logit_bias": {"1": 100, "106": 100},
    }  # Gemma's <eos> and <end_of_turn>
    stopped = http.post("/v1/completions", json=forced_end)
    kept_going = http.post("/v1/completions", json={**forced_end, "ignore_eos": True})
    assert stopped.status_code == kept_going.status_code == 200, (stopped.text, kept_going.text)
    assert stopped.json()["choices"][0]["finish_reason"] == "stop" and stopped.json()["usage"]["completion_tokens"] == 1
    assert kept_going.json()["choices"][0]["finish_reason"] == "length"
    assert kept_going.json()["usage"]["completion_tokens"] == 12
