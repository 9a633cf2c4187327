"""Limits on a JSON schema itself, checked before any grammar work (pure: no I/O, no grammar library).

A schema of a few hundred bytes can ask a grammar compiler for unbounded work:
``minLength: 200000000`` written out as text, a ``pattern`` with thousands of
alternatives, ``$defs`` nested hundreds deep. Every entry point that takes a
schema (chat ``response_format`` and ``tools``, ``/v1/completions``, and what the
Anthropic, Responses and Ollama APIs translate into those) is checked here, by
the gateway for every engine and by the llama.cpp worker again when it parses the
request, in one walk over the parsed JSON: well under 100 ms for the largest
schema accepted. A breach is a 400 naming the request field.

The limits are far above what real schemas use (tool and output schemas of
public APIs nest under 12 levels, enumerate tens of values, bound strings at
most in the tens of thousands of characters and write patterns of at most a few
hundred characters) and far below what costs a compiler seconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from appliance.errors import BadRequest
from appliance.jsontypes import JsonValue

#: Largest serialised schema (bytes of compact JSON).
MAX_SCHEMA_BYTES = 64 * 1024
#: Deepest nesting of JSON objects and arrays in a schema.
MAX_DEPTH = 64
#: Largest repetition count: ``minLength``, ``maxLength``, ``minItems``, ``maxItems``, ``minProperties``,
#: ``maxProperties``, ``minContains``, ``maxContains``, and ``{n}`` / ``{n,m}`` in a ``pattern`` (nested
#: quantifiers multiply: ``(a{100}){100}`` counts 10,000).
MAX_REPEAT = 100_000
#: Most alternatives in one schema: ``enum`` values, ``anyOf`` / ``oneOf`` branches and ``|`` branches of
#: every ``pattern``, summed.
MAX_ALTERNATIVES = 256
#: Longest ``pattern`` (or ``patternProperties`` key), in characters.
MAX_PATTERN_CHARS = 2_048
#: Most ``logit_bias`` entries in one request.
MAX_LOGIT_BIAS = 1_024

REPEAT_KEYS = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"}
)
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True)
class PatternCost:
    """What a regular expression asks of a compiler: its ``|`` branches and its largest (nested) repetition count."""

    alternatives: int
    repeat: int


def pattern_cost(pattern: str) -> PatternCost:
    """Count ``pattern``'s ``|`` alternatives (a group with k bars has k + 1) and its largest repetition product.

    Escapes and character classes are skipped; ``{n}``, ``{n,}`` and ``{n,m}`` after an
    atom or a group count max(n, m), multiplied through enclosing quantified groups.
    """
    alternatives = 0
    # per open group: [bars seen, largest repetition inside]
    frames: list[list[int]] = [[0, 1]]
    last = 1  # the repetition of the atom a quantifier would apply to
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            last = 1
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            last = 1
            continue
        if c == "(":
            frames.append([0, 1])
            i += 1
            continue
        if c == ")" and len(frames) > 1:
            bars, inner = frames.pop()
            alternatives += bars + 1 if bars else 0
            last = inner
            frames[-1][1] = max(frames[-1][1], inner)
            i += 1
            continue
        if c == "|":
            frames[-1][0] += 1
            i += 1
            continue
        if c == "{":
            m = _QUANTIFIER.match(pattern, i)
            if m:
                lo, hi = int(m.group(1)), m.group(2)
                count = max(lo, int(hi)) if hi else lo
                frames[-1][1] = max(frames[-1][1], last * count)
                last = 1
                i = m.end()
                continue
        last = 1
        i += 1
    while frames:
        bars, inner = frames.pop()
        alternatives += bars + 1 if bars else 0
        if frames:
            frames[-1][1] = max(frames[-1][1], inner)
        else:
            repeat = inner
    return PatternCost(alternatives, repeat)


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at ``i`` (or the end of the pattern)."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1  # a leading ] is a literal
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j + 1
        j += 1
    return j


def _refuse(param: str, subject: str, where: str, detail: str) -> BadRequest:
    at = f" (at {where})" if where else ""
    return BadRequest(f"{param}: the JSON schema's {subject}{at} {detail}", param=param)


def _check_pattern(pattern: str, param: str, where: str) -> int:
    """Check one regular expression; return its alternatives."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _refuse(param, "pattern", where, f"has {len(pattern)} characters; at most {MAX_PATTERN_CHARS} are accepted")
    cost = pattern_cost(pattern)
    if cost.repeat > MAX_REPEAT:
        raise _refuse(param, "pattern", where, f"repeats {cost.repeat} times; at most {MAX_REPEAT} are accepted")
    return cost.alternatives


def _check_depth(schema: JsonValue, param: str) -> None:
    stack: list[tuple[JsonValue, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _refuse(param, "nesting", "", f"is deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def check_schema(schema: JsonValue, param: str) -> None:
    """Raise :class:`BadRequest` naming ``param`` if ``schema`` breaks one of this module's limits.

    Only positions where a keyword is a schema keyword are read: a property named
    ``minLength`` holds a schema (an object), not a count, and ``enum`` / ``const``
    values are data.
    """
    _check_depth(schema, param)  # first: serialising an arbitrarily deep value would recurse
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > MAX_SCHEMA_BYTES:
        raise _refuse(param, "size", "", f"is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted")
    alternatives = 0
    stack: list[tuple[JsonValue, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            here = f"{where}.{key}" if where else key
            if key in ("enum", "const", "default", "examples"):
                if key == "enum" and isinstance(value, list):
                    alternatives += len(value)
                continue  # data, not schemas
            if key in REPEAT_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                if value > MAX_REPEAT:
                    shown = int(value) if float(value).is_integer() else value
                    raise _refuse(param, key, here, f"is {shown}; at most {MAX_REPEAT} is accepted")
                continue
            if key == "pattern" and isinstance(value, str):
                alternatives += _check_pattern(value, param, here)
                continue
            if key == "patternProperties" and isinstance(value, dict):
                for regex in value:
                    alternatives += _check_pattern(regex, param, here)
            if key in ("anyOf", "oneOf") and isinstance(value, list):
                alternatives += len(value)
            stack.append((value, here))
        if alternatives > MAX_ALTERNATIVES:
            raise _refuse(
                param,
                "enum values, anyOf/oneOf branches and pattern alternatives",
                "",
                f"number {alternatives}; at most {MAX_ALTERNATIVES} are accepted",
            )


def check_logit_bias(logit_bias: JsonValue) -> None:
    """At most :data:`MAX_LOGIT_BIAS` entries (each is a token the sampler must adjust, every step)."""
    if isinstance(logit_bias, dict) and len(logit_bias) > MAX_LOGIT_BIAS:
        raise BadRequest(f"logit_bias has {len(logit_bias)} entries; at most {MAX_LOGIT_BIAS} are accepted", param="logit_bias")


def response_format_schema(response_format: object) -> JsonValue:
    """The JSON schema of a chat ``response_format`` (a dict or an object with ``type`` / ``json_schema``), or None."""
    if isinstance(response_format, dict):
        kind, spec = response_format.get("type"), response_format.get("json_schema")
    else:
        kind, spec = getattr(response_format, "type", None), getattr(response_format, "json_schema", None)
    if kind != "json_schema" or not isinstance(spec, dict):
        return None
    return spec.get("schema")


def tool_schemas(tools: JsonValue) -> list[JsonValue]:
    """The parameter schemas of a chat ``tools`` list (malformed entries are left to the request's validation)."""
    out: list[JsonValue] = []
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("parameters") is not None:
            out.append(fn["parameters"])
    return out


def check_request(body: object) -> None:
    """Check the schemas and ``logit_bias`` of a generation request (a chat or completion body, dict or struct)."""
    get = body.get if isinstance(body, dict) else lambda name: getattr(body, name, None)
    schema = response_format_schema(get("response_format"))
    if schema is not None:
        check_schema(schema, "response_format")
    for params in tool_schemas(get("tools")):
        check_schema(params, "tools")
    check_logit_bias(get("logit_bias"))
