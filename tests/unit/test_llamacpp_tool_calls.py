"""Tool calls and reasoning parsed out of what real models write, whole and streamed.

The samples are written the way each family emits them (Qwen2.5 / Hermes blocks,
Llama 3.1 JSON and ``<|python_tag|>``, Mistral v0.3 ``[TOOL_CALLS]``, DeepSeek-R1
traces). Every sample is also fed split at every character boundary, char by
char, and in random pieces: the result must be the same as the whole text's.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.drivers.llamacpp.tool_calls import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    OutputParser,
    ToolFormat,
    calls_from_json,
    template_thinks,
    tool_format,
)

NAMES = frozenset({"get_weather", "get_time"})
PARIS = {"city": "Paris", "unit": "celsius"}
OSLO = {"city": "Oslo", "unit": "celsius"}

# (format, thinks, prompt opened <think>, text, expected content, expected reasoning, expected calls)
SAMPLES = {
    "qwen2.5 call": (
        HERMES,
        False,
        False,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "",
        "",
        [("get_weather", PARIS)],
    ),
    "qwen2.5 text before a call": (
        HERMES,
        False,
        False,
        "I'll check the current weather in Paris for you.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "I'll check the current weather in Paris for you.\n",
        "",
        [("get_weather", PARIS)],
    ),
    "qwen2.5 two parallel calls": (
        HERMES,
        False,
        False,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
        '"unit": "celsius"}}\n</tool_call>',
        "",
        "",
        [("get_weather", PARIS), ("get_weather", OSLO)],
    ),
    "qwen2.5 malformed JSON": (
        HERMES,
        False,
        False,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
        "",
        [],
    ),
    "qwen2.5 unknown tool": (
        HERMES,
        False,
        False,
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        "",
        [],
    ),
    "qwen2.5 plain answer": (HERMES, False, False, "It is sunny in Paris <today>.", "It is sunny in Paris <today>.", "", []),
    "qwen2.5 unclosed block at the end": (
        HERMES,
        False,
        False,
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}',
        "",
        "",
        [("get_time", {"zone": "UTC"})],
    ),
    "llama3.1 json": (
        LLAMA3,
        False,
        False,
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        "",
        [("get_weather", PARIS)],
    ),
    "llama3.1 python_tag": (
        LLAMA3,
        False,
        False,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        "",
        [("get_weather", PARIS)],
    ),
    "llama3.1 two calls": (
        LLAMA3,
        False,
        False,
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}',
        "",
        "",
        [("get_weather", PARIS), ("get_weather", OSLO)],
    ),
    "llama3.1 built-in tool code": (
        LLAMA3,
        False,
        False,
        '<|python_tag|>brave_search.call(query="weather Paris")',
        '<|python_tag|>brave_search.call(query="weather Paris")',
        "",
        [],
    ),
    "llama3.1 JSON answer that is no call": (LLAMA3, False, False, '{"temperature": 21}', '{"temperature": 21}', "", []),
    "llama3.1 broken JSON": (
        LLAMA3,
        False,
        False,
        '{"name": "get_weather", "parameters": {"city": ',
        '{"name": "get_weather", "parameters": {"city": ',
        "",
        [],
    ),
    "mistral two calls": (
        MISTRAL,
        False,
        False,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]',
        "",
        "",
        [("get_weather", PARIS), ("get_weather", OSLO)],
    ),
    "mistral text then marker junk": (MISTRAL, False, False, "[TOOL_CALLS] sorry", "[TOOL_CALLS] sorry", "", []),
    "mistral bracketed answer": (MISTRAL, False, False, "[1] Paris is the capital.", "[1] Paris is the capital.", "", []),
    "generic call": (
        GENERIC,
        False,
        False,
        '{"name": "get_time", "arguments": {"zone": "UTC"}}',
        "",
        "",
        [("get_time", {"zone": "UTC"})],
    ),
    "generic tool_calls list": (
        GENERIC,
        False,
        False,
        '{"tool_calls": [{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}]}',
        "",
        "",
        [("get_time", {"zone": "UTC"})],
    ),
    "r1 trace opened by the prompt": (
        None,
        True,
        True,
        "Okay, the user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of France is **Paris**.",
        "The capital of France is **Paris**.",
        "Okay, the user asks for the capital of France. That is Paris.\n",
        [],
    ),
    "r1 trace opened by the model": (
        None,
        True,
        False,
        "<think>\nShort question; answer directly.\n</think>\n\nParis.",
        "Paris.",
        "\nShort question; answer directly.\n",
        [],
    ),
    "r1 cut off while thinking": (None, True, True, "Let me think about < and </thi", "", "Let me think about < and </thi", []),
    "qwen3 trace then a call": (
        HERMES,
        True,
        False,
        "<think>\nThe user wants the weather; call the tool.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "",
        "\nThe user wants the weather; call the tool.\n",
        [("get_weather", PARIS)],
    ),
    "no tools: a call-looking text stays content": (
        None,
        False,
        False,
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
        "",
        [],
    ),
}


def _collect(parser: OutputParser, pieces: list[str]) -> tuple[str, str, list[tuple[str, dict]]]:
    out = []
    for p in pieces:
        out += parser.feed(p)
    out += parser.flush()
    content = "".join(v for k, v in out if k == "content")
    reasoning = "".join(v for k, v in out if k == "reasoning")
    calls = [(v.name, json.loads(v.arguments)) for k, v in out if k == "call"]
    assert all(v.id.startswith("call_") for k, v in out if k == "call")
    return content, reasoning, calls


def _parser(fmt: ToolFormat | None, thinks: bool, opened: bool) -> OutputParser:
    return OutputParser(fmt, thinks=thinks, in_reasoning=opened, names=NAMES if fmt else frozenset())


@pytest.mark.parametrize("name", list(SAMPLES))
def test_whole_text(name):
    fmt, thinks, opened, text, content, reasoning, calls = SAMPLES[name]
    assert _collect(_parser(fmt, thinks, opened), [text]) == (content, reasoning, calls)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_split_at_every_boundary_and_char_by_char(name):
    fmt, thinks, opened, text, content, reasoning, calls = SAMPLES[name]
    for i in range(len(text) + 1):
        assert _collect(_parser(fmt, thinks, opened), [text[:i], text[i:]]) == (content, reasoning, calls), i
    assert _collect(_parser(fmt, thinks, opened), list(text)) == (content, reasoning, calls)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(SAMPLES)), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_random_pieces(name, cuts):
    fmt, thinks, opened, text, content, reasoning, calls = SAMPLES[name]
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _collect(_parser(fmt, thinks, opened), pieces) == (content, reasoning, calls)


def test_content_is_streamed_before_the_end():
    parser = OutputParser(HERMES, names=NAMES)
    assert parser.feed("The weather ") == [("content", "The weather ")]
    assert parser.feed("is <tool") == [("content", "is ")]  # "<tool" may open a call: held back
    assert parser.feed("s> fine") == [("content", "<tools> fine")]


def test_calls_come_out_as_soon_as_they_close():
    parser = OutputParser(HERMES, names=NAMES)
    first = parser.feed('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_')
    assert [k for k, _ in first] == ["call"]


@pytest.mark.parametrize(
    "template, fmt",
    [
        ("{% for m in messages %}<|im_start|>...{% if tools %}<tool_call>{% endif %}", HERMES),
        ("{{ '<|start_header_id|>ipython<|end_header_id|>' }}{% if tools %}<|python_tag|>{% endif %}", LLAMA3),
        ("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", MISTRAL),
        ("<start_of_turn>user\n{{ m.content }}<end_of_turn>", GENERIC),
        (None, GENERIC),
    ],
)
def test_format_from_the_template(template, fmt):
    assert tool_format(template) is fmt


def test_thinking_templates():
    assert template_thinks("{{ '<｜Assistant｜><think>\\n' }}")
    assert template_thinks("{% set content = content.split('</think>')[-1] %}")
    assert not template_thinks("<|im_start|>assistant\n")
    assert not template_thinks(None)


def test_call_shapes():
    assert calls_from_json({"function": {"name": "get_time", "arguments": "{}"}}, NAMES)[0].arguments == "{}"
    assert calls_from_json({"name": "get_time", "arguments": "not json"}, NAMES) is None
    assert calls_from_json({"name": "get_time", "arguments": [1]}, NAMES) is None
    assert calls_from_json([], NAMES) is None
    assert calls_from_json({"name": "get_time"}, NAMES)[0].arguments == "{}"
