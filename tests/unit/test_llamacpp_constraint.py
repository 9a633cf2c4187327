"""llguidance constraints on a real (tiny) GGUF vocabulary: compile, mask a logits row, consume, end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from appliance.drivers.llamacpp.constraint import GrammarCompiler
from appliance.drivers.llamacpp.grammar import closed_objects, grammar_for
from appliance.drivers.llamacpp.model import LoadedModel
from appliance.drivers.llamacpp.sampling import free_chain
from appliance.drivers.llamacpp.tool_calls import HERMES
from appliance.drivers.llamacpp.tool_choice import REQUIRED, ToolChoice, forced_call_grammar
from appliance.errors import BadRequest

PICK = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "n", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tiny_gguf):
    m = LoadedModel(str(tiny_gguf))
    yield m
    m.close()


@pytest.fixture(scope="module")
def compiler(model):
    return GrammarCompiler(model.vocab, model.eog_tokens(), model.info.n_vocab)


def walk(model, constraint, seed: int, limit: int = 400) -> tuple[str, bool]:
    """Sample from random logits rows under the constraint (argmax of the masked row); (text, grammar complete)."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    for _ in range(limit):
        if constraint.stopped:
            assert not constraint.error
            return model.detokenize(tokens), True
        row = (rng.standard_normal(model.info.n_vocab) * 4).astype(np.float32)
        assert constraint.apply(row)
        assert np.isfinite(row).sum() >= 1
        t = int(row.argmax())
        assert np.isfinite(row[t])
        if model.is_eog(t):  # allowed only where the grammar may end
            return model.detokenize(tokens), True
        assert constraint.consume(t), constraint.error
        tokens.append(t)
    return model.detokenize(tokens), False


@pytest.mark.parametrize("seed", range(6))
def test_masked_sampling_follows_the_schema(model, compiler, seed):
    c = compiler.compile(grammar_for({"type": "json_schema", "json_schema": {"schema": PICK}}), "response_format")
    text, complete = walk(model, c, seed)
    assert complete, text
    value = json.loads(text)
    assert value["colour"] in ("red", "green", "blue") and 0 <= value["n"] <= 99 and isinstance(value["ok"], bool)
    assert set(value) == {"colour", "n", "ok"}


def test_a_complete_grammar_ends_with_an_end_of_generation_token(model, compiler):
    c = compiler.compile("start: %json" + json.dumps({"const": "done"}), "response_format")
    text, complete = walk(model, c, 0)
    assert complete and text == '"done"'
    assert c.stopped and not c.error
    assert model.is_eog(c.end_token)


def test_a_token_outside_the_grammar_is_refused(model, compiler):
    c = compiler.compile(grammar_for({"type": "json_object"}), "response_format")
    row = np.zeros(model.info.n_vocab, dtype=np.float32)
    assert c.apply(row)
    banned = [t for t in model.tokenize("hello", add_special=False) if row[t] == -np.inf]
    assert banned  # "hello" cannot start a JSON object
    assert not c.consume(banned[0])
    assert c.error


def test_forced_hermes_call_is_wrapped_in_its_markers(model, compiler):
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "additionalProperties": False}}}]
    c = compiler.compile(forced_call_grammar(HERMES, tools, ToolChoice(REQUIRED)), "tools")
    text, complete = walk(model, c, 0)
    assert complete, text
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    assert json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")]) == {"name": "ping", "arguments": {}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "strnig"}}},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    ],
)
def test_schemas_the_library_rejects_are_a_400_naming_the_field(compiler, schema):
    with pytest.raises(BadRequest) as info:
        compiler.compile(grammar_for({"type": "json_schema", "json_schema": {"schema": schema}}), "response_format")
    assert info.value.param == "response_format"


def test_compile_over_budget_is_a_400(compiler):
    with pytest.raises(BadRequest) as info:
        compiler.compile(grammar_for({"type": "json_object"}), "tools", budget_s=0.0)
    assert info.value.param == "tools" and "budget" in str(info.value)


def test_free_chain_closes_a_constraint(compiler):
    c = compiler.compile(grammar_for({"type": "json_object"}), "response_format")
    free_chain(c)
    with pytest.raises(AttributeError):
        c.consume(5)


@pytest.mark.parametrize("seed", range(4))
def test_objects_that_declare_properties_admit_no_other_keys(model, compiler, seed):
    schema = {k: v for k, v in PICK.items() if k != "additionalProperties"}
    schema["properties"] = {**PICK["properties"], "inner": {"type": "object", "properties": {"x": {"type": "boolean"}}}}
    c = compiler.compile(grammar_for({"type": "json_schema", "json_schema": {"schema": schema}}), "response_format")
    text, complete = walk(model, c, seed)
    assert complete, text
    value = json.loads(text)
    assert set(value) <= {"colour", "n", "ok", "inner"} and set(value.get("inner", {})) <= {"x"}


def test_closed_objects_leaves_open_schemas_and_allof_members_open():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {}}, "additionalProperties": True}},
        "allOf": [{"properties": {"b": {}}}, {"properties": {"c": {}}}],
        "items": {"properties": {"y": {}}},
        "enum": [{"properties": {}}],
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["items"]["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is True
    assert all("additionalProperties" not in m for m in closed["allOf"])
    assert closed["enum"] == [{"properties": {}}] and "additionalProperties" not in schema  # data untouched, input not mutated


def test_any_object_bounds_numbers_at_16_digits(model, compiler):
    byte = {b: 3 + b for b in range(256)}  # the tiny vocabulary's byte tokens follow <unk>, <s>, </s>
    c = compiler.compile(grammar_for({"type": "json_object"}), "response_format")
    for b in b'{"a":\n  1234567890123456':
        assert c.consume(byte[b]), c.error
    row = np.zeros(model.info.n_vocab, dtype=np.float32)
    assert c.apply(row)
    assert row[byte[ord("7")]] == -np.inf  # a 17th digit
    assert row[byte[ord("}")]] == 0 and row[byte[ord(",")]] == 0 and row[byte[ord(".")]] == 0
