"""``tools`` and ``tool_choice`` of a chat request, and the grammar that enforces a call.

``tool_choice`` ``"required"`` or a named function is enforced, not hoped for: the
sampler gets a grammar (Lark, for llguidance) that admits exactly one call, in the
family's own syntax (:mod:`.tool_calls`): the family's literal prefix, the call as
an embedded ``%json{...}`` schema whose arguments follow the tool's JSON schema
(checked against the same limits as ``response_format``), the literal suffix.
Even a base model then answers with a call that parses and validates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .grammar import schema_rule
from .tool_calls import HERMES, MISTRAL, ToolFormat

AUTO, NONE, REQUIRED, FUNCTION = "auto", "none", "required", "function"


@dataclass(frozen=True)
class ToolChoice:
    mode: str = AUTO  # auto | none | required | function
    name: str | None = None  # the function, for mode "function"

    @property
    def forced(self) -> bool:
        return self.mode in (REQUIRED, FUNCTION)


def tool_names(tools: JsonValue) -> frozenset[str]:
    """The function names of a validated ``tools`` list."""
    return frozenset(t["function"]["name"] for t in tools or [])


def check_tools(tools: JsonValue) -> list[JsonObject] | None:
    """``tools`` as OpenAI defines it: function tools, each with a name and an optional schema."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise BadRequest('each tool must be {"type": "function", "function": {...}}', param="tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest("each tool's function needs a name", param="tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise BadRequest("a tool's parameters must be a JSON schema object", param="tools")
    return tools


def parse_tool_choice(value: JsonValue, tools: list[JsonObject] | None) -> ToolChoice:
    """Validate ``tool_choice`` against the offered ``tools``."""
    if value is None or value == AUTO:
        return ToolChoice(AUTO)
    if value == NONE:
        return ToolChoice(NONE)
    names = tool_names(tools)
    if value == REQUIRED:
        if not names:
            raise BadRequest('tool_choice "required" needs tools', param="tool_choice")
        return ToolChoice(REQUIRED)
    fn = value.get("function") if isinstance(value, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise BadRequest(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise BadRequest(f"tool_choice names the function {name!r}, which is not in tools", param="tool_choice")
    return ToolChoice(FUNCTION, name)


def _call_schema(tools: list[JsonObject], choice: ToolChoice, fmt: ToolFormat) -> JsonObject:
    branches = []
    for t in tools:
        fn = t["function"]
        if choice.mode == FUNCTION and fn["name"] != choice.name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, fmt.arguments_key: params},
                "required": ["name", fmt.arguments_key],
                "additionalProperties": False,
            }
        )
    return {"anyOf": branches}


def _literal(text: str, special: Callable[[str], int | None] | None) -> str:
    """A Lark literal for ``text``; where the vocabulary has it as one special token, that token is allowed too."""
    lit = json.dumps(text)
    token = special(text) if special is not None else None
    return lit if token is None else f"({lit} | <[{token}]>)"


def forced_call_grammar(
    fmt: ToolFormat, tools: list[JsonObject], choice: ToolChoice, special: Callable[[str], int | None] | None = None
) -> str:
    """A grammar for exactly one call to one of ``tools`` (or the named one) in ``fmt``'s syntax.

    ``special(marker)`` gives the token id of a marker the vocabulary holds as one
    special token (Hermes' ``<tool_call>`` in Qwen's vocabulary), else None.
    """
    call = "call: " + schema_rule(_call_schema(tools, choice, fmt), "tools")
    if fmt is HERMES:
        start = f'start: {_literal("<tool_call>", special)} "\\n" call "\\n" {_literal("</tool_call>", special)}'
    elif fmt is MISTRAL:  # [TOOL_CALLS] is a control token; the call list alone is parsed as calls
        start = 'start: "[" call "]"'
    else:
        start = "start: call"
    return start + "\n" + call
