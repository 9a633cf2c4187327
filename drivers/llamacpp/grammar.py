"""``response_format`` → a Lark grammar for llguidance (compiled later, per request, by :mod:`.constraint`).

``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema",
"json_schema": {"schema": {...}}}`` embeds the schema as ``%json{...}``. Anything
else is a 400. The schema's own limits (size, depth, repetition counts,
alternatives, pattern length: :mod:`appliance.serving.schema_limits`) are checked
here, at parse time, before any grammar work; building the grammar text is a
``json.dumps``.

Object schemas that list ``properties`` and say nothing about other keys are
closed (``additionalProperties: false``), as llama.cpp's converter and OpenAI's
strict mode treat them: a model writes the declared keys and the object ends,
instead of inventing keys until ``max_tokens``. A schema that wants other keys
says so (``additionalProperties``, ``patternProperties``).
"""

from __future__ import annotations

import json

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue
from appliance.serving.schema_limits import check_schema

from .constraint import JSON_OPTIONS

#: Any JSON object, as llama.cpp's JSON grammar has it: a space or a newline with up to 20 spaces or tabs
#: of indentation where JSON allows whitespace, and numbers of at most 16 digits before and after the
#: point (a base model asked for "any object" otherwise writes ``1000000…`` until ``max_tokens``).
ANY_OBJECT = r"""start: object
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" WS? (pair ("," WS? pair)*)? "}"
pair: STRING WS? ":" WS? value WS?
array: "[" WS? (value WS? ("," WS? value WS?)*)? "]"
WS: / |\n[ \t]{0,20}/
STRING: /"(\\(["\\\/bfnrt]|u[a-fA-F0-9]{4})|[^"\\\x00-\x1F\x7F])*"/
NUMBER: /-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?[0-9]{1,3})?/
"""


#: Keywords whose value is one schema, and those whose value is a list or an object of schemas.
_ONE_SCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames", "additionalProperties")
_MANY_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems", "properties", "$defs", "definitions", "patternProperties")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema: JsonObject) -> JsonObject:
    """A copy of ``schema`` whose object schemas with ``properties`` and no word on other keys admit no other keys.

    ``allOf`` members are left open (closing each would forbid the keys of the
    others). Iterative; only schema positions are visited (``enum``, ``const`` and
    ``default`` are data).
    """
    root = dict(schema)
    stack: list[tuple[JsonObject, bool]] = [(root, True)]
    while stack:
        node, close = stack.pop()
        if close and isinstance(node.get("properties"), dict) and not any(k in node for k in _OPEN_KEYS):
            node["additionalProperties"] = False
        for key in _ONE_SCHEMA:
            if isinstance(node.get(key), dict):
                node[key] = dict(node[key])
                stack.append((node[key], True))
        for key in _MANY_SCHEMAS:
            value, members_close = node.get(key), key != "allOf"
            if isinstance(value, list):
                node[key] = [dict(v) if isinstance(v, dict) else v for v in value]
                stack.extend((v, members_close) for v in node[key] if isinstance(v, dict))
            elif isinstance(value, dict):
                node[key] = {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()}
                stack.extend((v, members_close) for v in node[key].values() if isinstance(v, dict))
    return root


def json_rule(schema: JsonObject) -> str:
    """The Lark expression that admits the JSON documents ``schema`` describes (with this module's JSON options)."""
    return "%json" + json.dumps({**closed_objects(schema), "x-guidance": JSON_OPTIONS}, separators=(",", ":"))


def grammar_for(response_format: JsonValue) -> str | None:
    """Return the grammar for an OpenAI ``response_format``, or None for plain text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise BadRequest("response_format must be an object", param="response_format")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            schema = {}  # OpenAI allows omitting it: any JSON object then
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object", param="response_format")
        if not schema:
            return ANY_OBJECT
        return "start: " + schema_rule(schema, "response_format")
    raise BadRequest(f"unsupported response_format type {kind!r}", param="response_format")


def schema_rule(schema: JsonObject, param: str) -> str:
    """``schema`` as a Lark expression, after its limits are checked (a 400 naming ``param`` otherwise)."""
    check_schema(schema, param)
    return json_rule(schema)
