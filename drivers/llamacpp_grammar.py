"""``response_format`` → a GBNF grammar that libllama's grammar sampler enforces.

``{"type": "json_object"}`` uses llama-cpp-python's generic JSON grammar;
``{"type": "json_schema", "json_schema": {"schema": {...}}}`` is converted with
its JSON-schema-to-GBNF converter. Anything else is a 400.
"""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from appliance.errors import BadRequest


def grammar_for(response_format: Any) -> str | None:
    """Return the GBNF grammar for an OpenAI ``response_format``, or None for plain text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise BadRequest("response_format must be an object", param="response_format")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_GBNF
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            schema = {}  # OpenAI allows omitting it: any JSON object then
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object", param="response_format")
        try:
            return json_schema_to_gbnf(json.dumps(schema or {"type": "object"}))
        except Exception as exc:  # the converter raises plain Exceptions on unsupported schemas
            raise BadRequest(f"unsupported JSON schema: {exc}", param="response_format") from None
    raise BadRequest(f"unsupported response_format type {kind!r}", param="response_format")
