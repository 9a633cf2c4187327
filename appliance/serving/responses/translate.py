"""Pure translation between OpenAI's Responses API and the chat completion request the gateway serves.

A conversation is a list of *items* in the Responses API's own shape, kept in
one normal form (what is stored for ``previous_response_id``):

- ``{"type": "message", "role", "content": [{"type": "input_text" | "output_text", "text"}]}``
- ``{"type": "function_call", "call_id", "name", "arguments"}``
- ``{"type": "function_call_output", "call_id", "output"}``
- ``{"type": "reasoning", ...}``: a reasoning model's thinking, kept with the answer but never sent back to the model
  (chat templates drop earlier turns' reasoning too)

:func:`input_items` reads a request's ``input`` into that form,
:func:`chat_request` turns a conversation and the request's options into a chat
completion request (checked by the chat schema itself, so the Responses API
serves exactly what chat serves), and :func:`output_items` /
:func:`response_object` turn the chat answer back into a Responses object.
Any value that cannot be served is a :class:`~appliance.errors.BadRequest`
naming the Responses field it came from.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import REFUSED, ChatCompletionRequest, ResponsesRequest
from appliance.serving.schema_limits import check_schema

Text = Annotated[str, msgspec.Meta(max_length=1_000_000)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
CallId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class _Part(msgspec.Struct):
    type: Literal["input_text", "output_text"]
    text: Text


class _Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[_Part]


class _FunctionCall(msgspec.Struct, kw_only=True):
    call_id: CallId
    name: Name
    arguments: Text


class _FunctionCallOutput(msgspec.Struct, kw_only=True):
    call_id: CallId
    output: Text | list[_Part]


class _Reasoning(msgspec.Struct, kw_only=True):
    id: str | None = None
    summary: list[JsonObject] = []
    content: list[JsonObject] | None = None


class _FunctionTool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: Name
    description: Annotated[str, msgspec.Meta(max_length=100_000)] | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class _JsonSchemaFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    name: Name
    schema: JsonObject
    description: str | None = None
    strict: bool | None = None


_ITEMS: dict[str, type[msgspec.Struct]] = {
    "message": _Message,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
    "reasoning": _Reasoning,
}
#: Chat request fields → the Responses field a client set them with.
_CHAT_TO_RESPONSES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}
_ERROR_PATH = re.compile(r"at `\$\.([A-Za-z_]+)")


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style: ``resp_…``, ``msg_…``, ``fc_…``."""
    return f"{prefix}_{secrets.token_hex(16)}"


def _text(content: str | list[_Part]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def input_items(value: str | list[JsonObject]) -> list[JsonObject]:
    """A request's ``input`` in the normal form (see the module docstring)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items: list[JsonObject] = []
    for index, raw in enumerate(value):
        kind = raw.get("type") or ("message" if "role" in raw else None)
        shape = _ITEMS.get(kind) if isinstance(kind, str) else None
        if shape is None:
            raise BadRequest(
                f"input[{index}]: items of type `{kind}` are not supported; use messages with text, "
                "function_call and function_call_output items.",
                param="input",
            )
        try:
            item = msgspec.convert({k: v for k, v in raw.items() if k != "type"}, shape)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"input[{index}]: {exc}", param="input") from None
        if isinstance(item, _Message):
            part = "output_text" if item.role == "assistant" else "input_text"
            items.append({"type": "message", "role": item.role, "content": [{"type": part, "text": _text(item.content)}]})
        elif isinstance(item, _FunctionCall):
            items.append({"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments})
        elif isinstance(item, _FunctionCallOutput):
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": _text(item.output)})
        elif isinstance(item, _Reasoning):
            items.append(
                {"type": "reasoning", "id": item.id or new_id("rs"), "summary": item.summary, "content": item.content or []}
            )
    return items


def chat_messages(items: list[JsonObject], instructions: str | None) -> list[JsonObject]:
    """The chat messages of a conversation: calls join the assistant turn they belong to, outputs become tool messages."""
    messages: list[JsonObject] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if item["type"] == "message":
            messages.append({"role": item["role"], "content": "".join(part["text"] for part in item["content"])})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item["type"] == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def chat_tools(tools: list[JsonObject]) -> list[JsonObject]:
    """Responses function tools (flat) as chat tools (``{"type": "function", "function": {...}}``)."""
    converted: list[JsonObject] = []
    for index, raw in enumerate(tools):
        if raw.get("type") != "function":
            raise BadRequest(f"tools[{index}]: only function tools are served; `{raw.get('type')}` tools are not.", param="tools")
        try:
            tool = msgspec.convert(raw, _FunctionTool)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"tools[{index}]: {exc}", param="tools") from None
        if tool.parameters is not None:
            check_schema(tool.parameters, f"tools[{index}].parameters")
        function: JsonObject = {"name": tool.name}
        for field in ("description", "parameters", "strict"):
            if getattr(tool, field) is not None:
                function[field] = getattr(tool, field)
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: str | JsonObject | None, tools: list[JsonObject]) -> str | JsonObject | None:
    """``tool_choice`` for chat: ``auto`` is what chat does without one; a named function must be one of the tools."""
    if choice is None or choice == "auto":
        return None
    if isinstance(choice, str):
        return choice
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str) or set(choice) - {"type", "name"}:
        raise BadRequest(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}.', param="tool_choice"
        )
    if name not in {tool["function"]["name"] for tool in tools}:
        raise BadRequest(f"tool_choice names the function `{name}`, which is not among the tools.", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def response_format(text: JsonObject | None) -> JsonObject | None:
    """``text.format`` as chat's ``response_format`` (``text``: none needed)."""
    if text is None:
        return None
    if set(text) - {"format"}:
        raise BadRequest(f"text: only `format` is served, not {sorted(set(text) - {'format'})}.", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        try:
            schema = msgspec.convert(fmt, _JsonSchemaFormat)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"text.format: {exc}", param="text") from None
        check_schema(schema.schema, "text.format")
        json_schema: JsonObject = {"name": schema.name, "schema": schema.schema}
        if schema.strict is not None:
            json_schema["strict"] = schema.strict
        if schema.description is not None:
            json_schema["description"] = schema.description
        return {"type": "json_schema", "json_schema": json_schema}
    raise BadRequest('text.format.type must be "text", "json_object" or "json_schema".', param="text")


def chat_request(body: ResponsesRequest, items: list[JsonObject]) -> ChatCompletionRequest:
    """The chat completion request that answers ``body`` over the conversation ``items``.

    It is validated by the chat schema, so a value chat does not serve (a
    ``tool_choice`` the engines cannot honour, say) is refused here too, naming
    the Responses field.
    """
    tools = chat_tools(body.tools) if body.tools else []
    choice = chat_tool_choice(body.tool_choice, tools)
    chat: JsonObject = {"model": body.model, "messages": chat_messages(items, body.instructions)}
    if tools and choice != "none":
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    for name, value in (
        ("max_tokens", body.max_output_tokens),
        ("temperature", body.temperature),
        ("top_p", body.top_p),
        ("response_format", response_format(body.text)),
    ):
        if value is not None:
            chat[name] = value
    if body.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    try:
        return msgspec.convert(chat, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        found = _ERROR_PATH.search(str(exc))
        field = found.group(1) if found else None
        param = _CHAT_TO_RESPONSES.get(field or "", field)
        raise BadRequest(REFUSED.get(param or "", f"{exc}"), param=param) from None


# ------------------------------------------------------------------ answers
@dataclass(frozen=True)
class ResponseHead:
    """What every Responses object of one request carries besides its output: the id and the request's options."""

    id: str
    created_at: int
    model: str
    request: JsonObject

    @classmethod
    def of(cls, body: ResponsesRequest, response_id: str, created_at: int) -> ResponseHead:
        request = {
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "previous_response_id": body.previous_response_id,
            "store": body.store is not False,
            "temperature": body.temperature if body.temperature is not None else 1.0,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": body.tools or [],
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "truncation": "disabled",
            "user": body.user,
        }
        return cls(id=response_id, created_at=created_at, model=body.model, request=request)


def message_item(item_id: str, text: str, status: str = "completed") -> JsonObject:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> JsonObject:
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> JsonObject:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def output_items(message: JsonObject) -> list[JsonObject]:
    """A chat answer's message as output items: its reasoning (if any), its text (if any, or if nothing else), then one
    item per tool call."""
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    items: list[JsonObject] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    if text or not items and not calls:
        items.append(message_item(new_id("msg"), text))
    for call in calls:
        function = call.get("function") or {}
        items.append(
            function_call_item(
                new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "", function.get("arguments") or ""
            )
        )
    return items


def response_usage(usage: JsonObject | None) -> JsonObject:
    """Chat usage as Responses usage."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def outcome(finish_reason: str | None) -> tuple[str, JsonObject | None]:
    """The Responses status for a chat finish reason: a length stop is ``incomplete``."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_object(
    head: ResponseHead,
    *,
    status: str,
    output: list[JsonObject],
    model: str | None = None,
    usage: JsonObject | None = None,
    error: JsonObject | None = None,
    incomplete_details: JsonObject | None = None,
) -> JsonObject:
    """A Responses object (``object: "response"``) for ``head`` in the given state."""
    return {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete_details,
        "model": model or head.model,
        "output": output,
        **head.request,
        "usage": usage,
    }


def completed_response(head: ResponseHead, chat: JsonObject) -> JsonObject:
    """The Responses object for a (non-streamed) chat completion."""
    choice = (chat.get("choices") or [{}])[0]
    status, incomplete = outcome(choice.get("finish_reason"))
    return response_object(
        head,
        status=status,
        output=output_items(choice.get("message") or {}),
        model=chat.get("model"),
        usage=response_usage(chat.get("usage")),
        incomplete_details=incomplete,
    )
