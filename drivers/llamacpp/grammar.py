"""``response_format`` → a GBNF grammar that libllama's grammar sampler enforces.

``{"type": "json_object"}`` uses llama-cpp-python's generic JSON grammar;
``{"type": "json_schema", "json_schema": {"schema": {...}}}`` is converted with
its JSON-schema-to-GBNF converter. Anything else is a 400.

Size bounds: libllama's grammar sampler keeps one parse stack per live
alternative and checks every candidate token against each of them, so a
5,000-string enum costs 10–18 s per filtered token on a 262k vocabulary (two
cores). Schemas are refused with a 400 naming ``response_format`` past
:data:`MAX_SCHEMA_BYTES` (serialised schema), :data:`MAX_ALTERNATIVES`
(``enum`` values plus ``anyOf``/``oneOf`` branches, summed over the schema) or
:data:`MAX_GBNF_BYTES` (the generated grammar); the count is taken before the
converter runs.
"""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from appliance.errors import BadRequest
from appliance.jsontypes import JsonValue

#: Largest serialised JSON schema accepted in ``response_format``.
MAX_SCHEMA_BYTES = 64 * 1024
#: Most ``enum`` values plus ``anyOf``/``oneOf`` branches in one schema.
MAX_ALTERNATIVES = 256
#: Largest GBNF grammar a schema may turn into.
MAX_GBNF_BYTES = 128 * 1024


def count_alternatives(schema: JsonValue) -> int:
    """``enum`` values plus ``anyOf``/``oneOf`` branches anywhere in ``schema``.

    Iterative; the walk is bounded by the schema's size, checked first.
    """
    total = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "enum" and isinstance(value, list):
                    total += len(value)
                    continue  # enum values are data, not schemas
                if key in ("anyOf", "oneOf") and isinstance(value, list):
                    total += len(value)
                if key == "const":
                    continue
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return total


def grammar_for(response_format: JsonValue) -> str | None:
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
        return schema_grammar(schema or {"type": "object"}, "response_format")
    raise BadRequest(f"unsupported response_format type {kind!r}", param="response_format")


def schema_grammar(schema: JsonValue, param: str) -> str:
    """A JSON schema's GBNF grammar, within the size bounds; a 400 naming ``param`` otherwise."""
    text = json.dumps(schema)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise BadRequest(f"{param}: the JSON schema is larger than {MAX_SCHEMA_BYTES} bytes", param=param)
    n = count_alternatives(schema)
    if n > MAX_ALTERNATIVES:
        raise BadRequest(
            f"{param}: the JSON schema has {n} enum values and anyOf/oneOf branches; at most {MAX_ALTERNATIVES} are accepted",
            param=param,
        )
    try:
        gbnf = json_schema_to_gbnf(text)
    except Exception as exc:  # the converter raises plain Exceptions on unsupported schemas
        raise BadRequest(f"unsupported JSON schema: {exc}", param=param) from None
    if len(gbnf.encode()) > MAX_GBNF_BYTES:
        raise BadRequest(f"{param}: the schema's grammar is larger than {MAX_GBNF_BYTES} bytes", param=param)
    return gbnf
