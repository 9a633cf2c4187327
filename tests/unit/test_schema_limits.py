"""The limits on a JSON schema itself (appliance.serving.schema_limits): pure, before any grammar work."""

from __future__ import annotations

import time

import pytest

from appliance.errors import BadRequest
from appliance.openai_schema import ChatCompletionRequest, ResponseFormat
from appliance.serving.schema_limits import (
    MAX_ALTERNATIVES,
    MAX_DEPTH,
    MAX_LOGIT_BIAS,
    MAX_PATTERN_CHARS,
    MAX_REPEAT,
    MAX_SCHEMA_BYTES,
    PatternCost,
    check_request,
    check_schema,
    pattern_cost,
)


def refused(schema, param: str = "response_format") -> str:
    with pytest.raises(BadRequest) as info:
        check_schema(schema, param)
    assert info.value.param == param
    return str(info.value)


def string_prop(**kw) -> dict:
    return {"type": "object", "properties": {"a": {"type": "string", **kw}}}


@pytest.mark.parametrize(
    "key", ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"]
)
def test_repetition_counts_are_bounded(key):
    check_schema(string_prop(**{key: MAX_REPEAT}), "response_format")
    msg = refused(string_prop(**{key: MAX_REPEAT + 1}))
    assert key in msg and "properties.a" in msg
    assert key in refused(string_prop(**{key: 2e8}))  # a float spelling is a count too


def test_the_250_byte_bomb_is_refused_by_name():
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}}
    assert "minLength" in refused(schema, "tools")


def test_keywords_as_property_names_and_data_are_not_counts():
    schema = {
        "type": "object",
        "properties": {"minLength": {"type": "integer"}, "pattern": {"type": "string"}, "enum": {"type": "string"}},
        "default": {"maxItems": 10**9},
        "examples": [{"minLength": 10**9}],
        "const": {"pattern": "a{999999}"},
    }
    check_schema(schema, "response_format")


@pytest.mark.parametrize(
    ("pattern", "cost"),
    [
        ("^[a-z]+$", PatternCost(0, 1)),
        ("^(a|b|c)$", PatternCost(3, 1)),
        ("a|b", PatternCost(2, 1)),
        ("x{5}", PatternCost(0, 5)),
        ("x{2,}", PatternCost(0, 2)),
        ("x{3,70}", PatternCost(0, 70)),
        ("(a{100}){100}", PatternCost(0, 10_000)),
        ("(?:(ab){10}|c){20}", PatternCost(2, 200)),
        (r"[|{(]{3}\|\{9\}", PatternCost(0, 3)),  # classes and escapes are literal
        ("[]|]x", PatternCost(0, 1)),
        ("a{,5}", PatternCost(0, 1)),  # not a quantifier in JSON schema regexes: literal text
        ("((a|b){4}|c){1000}", PatternCost(4, 4_000)),
    ],
)
def test_pattern_cost(pattern, cost):
    assert pattern_cost(pattern) == cost


def test_pattern_repetition_alternatives_and_length():
    assert "pattern" in refused(string_prop(pattern="^a{100001}$"))
    assert "repeats 1000000" in refused(string_prop(pattern="^(a{1000}){1000}$"))
    check_schema(string_prop(pattern="^(a{100}){1000}$"), "response_format")
    assert "alternatives" in refused(string_prop(pattern="^(" + "|".join(f"w{i}" for i in range(MAX_ALTERNATIVES + 1)) + ")$"))
    check_schema(string_prop(pattern="^(" + "|".join(f"w{i}" for i in range(MAX_ALTERNATIVES)) + ")$"), "response_format")
    assert "characters" in refused(string_prop(pattern="a" * (MAX_PATTERN_CHARS + 1)))
    big = {"type": "object", "patternProperties": {"^(" + "|".join(f"k{i}" for i in range(300)) + ")$": {}}}
    assert "alternatives" in refused(big)


def test_alternatives_are_summed_over_the_schema():
    half = [str(i) for i in range(MAX_ALTERNATIVES // 2)]
    ok = {"anyOf": [{"enum": half[:-1]}, {"enum": half[:-1]}]}  # 2 branches + 2 * 127 values = 256
    check_schema(ok, "response_format")
    assert "number 257" in refused({"anyOf": [{"enum": half[:-1]}, {"enum": half}]})
    assert "anyOf" in refused({"oneOf": [{"type": "integer"}] * (MAX_ALTERNATIVES + 1)})


def test_depth_and_size():
    deep: dict = {"type": "string"}
    for _ in range(MAX_DEPTH):
        deep = {"type": "array", "items": deep}
    assert "nesting" in refused(deep)
    very_deep: list = []
    for _ in range(100_000):  # deeper than Python's recursion limit: the walk is iterative
        very_deep = [very_deep]
    assert "nesting" in refused({"const": very_deep})
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 60} for i in range(1000)}}
    assert "bytes" in refused(wide)
    check_schema({"type": "object", "description": "x" * (MAX_SCHEMA_BYTES - 100)}, "response_format")


def test_largest_accepted_schema_is_checked_well_under_100_ms():
    props = {f"p{i}": {"type": "string", "maxLength": 100, "pattern": "^[a-z]{1,9}$"} for i in range(900)}
    schema = {"type": "object", "properties": props}
    t0 = time.perf_counter()
    check_schema(schema, "response_format")
    assert time.perf_counter() - t0 < 0.1  # milliseconds of work; the bound is generous


def test_requests_check_response_format_tools_and_logit_bias():
    bomb = {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}}
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        response_format=ResponseFormat(type="json_schema", json_schema={"name": "o", "schema": bomb}),
    )
    with pytest.raises(BadRequest) as info:
        check_request(body)
    assert info.value.param == "response_format"
    tools = [{"type": "function", "function": {"name": "f", "parameters": bomb}}]
    with pytest.raises(BadRequest) as info:
        check_request({"tools": tools})
    assert info.value.param == "tools"
    with pytest.raises(BadRequest) as info:
        check_request({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}})
    assert info.value.param == "logit_bias"
    check_request({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS)}, "response_format": {"type": "json_object"}})
