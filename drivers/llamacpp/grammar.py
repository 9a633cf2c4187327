"""``response_format`` → a Lark grammar for llguidance (compiled later, per request, by :mod:`.constraint`).

``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema",
"json_schema": {"schema": {...}}}`` embeds the schema as ``%json{...}``. Anything
else is a 400. The schema's own limits (size, depth, repetition counts,
alternatives, pattern length: :mod:`appliance.serving.schema_limits`) are checked
here, at parse time, before any grammar work; building the grammar text is a
``json.dumps``.
"""

from __future__ import annotations

import json

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue
from appliance.serving.schema_limits import check_schema

from .constraint import JSON_OPTIONS

#: Any JSON object.
ANY_OBJECT: JsonObject = {"type": "object"}


def json_rule(schema: JsonObject) -> str:
    """The Lark expression that admits the JSON documents ``schema`` describes (with this module's JSON options)."""
    return "%json" + json.dumps({**schema, "x-guidance": JSON_OPTIONS}, separators=(",", ":"))


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
        return "start: " + json_rule(ANY_OBJECT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            schema = {}  # OpenAI allows omitting it: any JSON object then
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object", param="response_format")
        return "start: " + schema_rule(schema or ANY_OBJECT, "response_format")
    raise BadRequest(f"unsupported response_format type {kind!r}", param="response_format")


def schema_rule(schema: JsonObject, param: str) -> str:
    """``schema`` as a Lark expression, after its limits are checked (a 400 naming ``param`` otherwise)."""
    check_schema(schema, param)
    return json_rule(schema)
