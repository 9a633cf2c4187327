"""tool_choice: validation, the grammar that forces a call (llguidance), and the OpenAI shapes of a structured answer."""

from __future__ import annotations

import json

import pytest

from appliance.drivers.llamacpp.chat_output import ChatOutput
from appliance.drivers.llamacpp.constraint import GrammarCompiler
from appliance.drivers.llamacpp.model import LoadedModel
from appliance.drivers.llamacpp.protocol import Shaper, parse_chat
from appliance.drivers.llamacpp.sampling import free_chain
from appliance.drivers.llamacpp.tool_calls import GENERIC, HERMES, LLAMA3, MISTRAL, OutputParser
from appliance.drivers.llamacpp.tool_choice import REQUIRED, ToolChoice, forced_call_grammar
from appliance.errors import BadRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]
ASK = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return parse_chat({"messages": ASK, **fields}, 1000)


def test_tool_choice_values():
    assert _chat(tools=TOOLS).tool_choice == ToolChoice("auto")
    assert _chat(tools=TOOLS, tool_choice="required").tool_choice.forced
    named = _chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ping"}}).tool_choice
    assert named == ToolChoice("function", "ping") and named.forced
    none = _chat(tools=TOOLS, tool_choice="none")
    assert none.tools is None and not none.tool_choice.forced


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "x", "parameters": "object"}}]}, "tools"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "ignore_eos": True}, "ignore_eos"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_refusals_name_the_field(fields, param):
    with pytest.raises(BadRequest) as info:
        _chat(**fields)
    assert info.value.param == param


@pytest.fixture(scope="module")
def model(tiny_gguf):
    m = LoadedModel(str(tiny_gguf), vocab_only=True)
    yield m
    m.close()


@pytest.fixture(scope="module")
def compiler(model):
    return GrammarCompiler(model.vocab, model.eog_tokens(), model.info.n_vocab)


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL, GENERIC])
@pytest.mark.parametrize("choice", [ToolChoice(REQUIRED), ToolChoice("function", "get_weather")])
def test_forced_grammars_compile_in_llguidance(compiler, fmt, choice):
    grammar = forced_call_grammar(fmt, TOOLS, choice)
    start, call = grammar.split("\n", 1)
    assert call.startswith("call: %json{")
    assert ('"ping"' in call) == (choice.mode == REQUIRED)  # a named choice admits only that function
    if fmt is LLAMA3:
        assert '"parameters"' in call
    if fmt is HERMES:
        assert start == 'start: "<tool_call>" "\\n" call "\\n" "</tool_call>"'
    constraint = compiler.compile(grammar, "tools")
    assert not constraint.stopped and not constraint.error
    free_chain(constraint)


def test_a_marker_held_as_one_special_token_is_allowed_as_that_token():
    grammar = forced_call_grammar(HERMES, TOOLS, ToolChoice(REQUIRED), {"<tool_call>": 7}.get)
    assert grammar.startswith('start: ("<tool_call>" | <[7]>) "\\n" call "\\n" "</tool_call>"')


def test_oversized_tool_schemas_are_refused_by_name():
    huge = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"x": {"enum": [str(i) for i in range(5000)]}}},
            },
        }
    ]
    with pytest.raises(BadRequest) as info:
        forced_call_grammar(HERMES, huge, ToolChoice(REQUIRED))
    assert info.value.param == "tools"


def _sse(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]


def test_streamed_calls_have_openais_fragments():
    out = ChatOutput(OutputParser(HERMES, names=frozenset({"get_weather", "ping"})), Shaper("chat", "m"), len, False)
    text = (
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    )
    raw = b"".join(out.chunks(text[i : i + 7]) for i in range(0, len(text), 7))
    last, finish = out.last_chunks("", "stop")
    assert finish == "tool_calls"
    deltas = [c["choices"][0]["delta"] for c in _sse(raw + last)]
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    fragments = [f for d in deltas for f in d.get("tool_calls", [])]
    assert [f["index"] for f in fragments] == [0, 0, 1, 1]
    first, args, second, _ = fragments
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert set(args) == {"index", "function"} and json.loads(args["function"]["arguments"]) == {"city": "Oslo"}
    assert second["function"]["name"] == "ping"


def test_whole_message_with_reasoning_and_a_call():
    parser = OutputParser(HERMES, thinks=True, names=frozenset({"ping"}))
    out = ChatOutput(parser, Shaper("chat", "m"), lambda s: len(s.split()), True)
    message, finish = out.message('<think>a b c</think>\n<tool_call>{"name": "ping", "arguments": {}}</tool_call>', "stop")
    assert finish == "tool_calls"
    assert message["content"] is None and message["reasoning_content"] == "a b c"
    assert message["tool_calls"][0]["function"] == {"name": "ping", "arguments": "{}"}
    assert out.reasoning_tokens(100) == len(["<think>a", "b", "c</think>"])
    assert out.reasoning_tokens(2) == 2  # never more than the completion


def test_a_call_cut_by_the_length_limit_is_content():
    out = ChatOutput(OutputParser(HERMES, names=frozenset({"ping"})), Shaper("chat", "m"), len, False)
    message, finish = out.message('<tool_call>{"name": "ping", "argu', "length")
    assert finish == "length" and message["content"] == '<tool_call>{"name": "ping", "argu'
    assert "tool_calls" not in message


def test_logprobs_of_text_the_parser_holds_ride_on_the_next_chunk_sent():
    """With tools and logprobs together, every token's logprob is sent exactly once, in order."""
    out = ChatOutput(OutputParser(HERMES, names=frozenset({"ping"})), Shaper("chat", "m"), len, False)
    text = 'Hi.<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    entry = lambda i: {"token": f"t{i}", "logprob": -0.1 * i, "bytes": [], "top_logprobs": []}  # noqa: E731
    raw = b"".join(out.chunks(piece, {"content": [entry(i)]}) for i, piece in enumerate(pieces[:-1]))
    last, finish = out.last_chunks(pieces[-1], "stop", {"content": [entry(len(pieces) - 1)]})
    chunks = _sse(raw + last)
    sent = [e["token"] for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert sent == [f"t{i}" for i in range(len(pieces))] and finish == "tool_calls"
    assert any(c["choices"][0]["delta"].get("tool_calls") for c in chunks)
