"""A Messages API request as the chat completion the gateway serves.

- ``system`` (a string or text blocks) becomes the first, ``system`` message.
- A user turn's ``tool_result`` blocks become ``tool`` messages (in order, before
  the turn's text), its text blocks one ``user`` message.
- An assistant turn's text blocks become its ``content``, its ``tool_use``
  blocks its ``tool_calls`` (``input`` serialised as the ``arguments`` string).
  The last message must be the user's: a prefill cannot be continued.
- ``tools`` become functions (``input_schema`` is the ``parameters``);
  ``tool_choice`` ``auto`` → the engines' default, ``none`` → the tools are not
  offered, ``any`` → ``"required"``, ``tool`` → the named function.
- ``stop_sequences`` → ``stop``; ``temperature``, ``top_p``, ``top_k`` and
  ``max_tokens`` carry over; ``output_config.format`` (a JSON schema) →
  ``response_format`` ``json_schema``; a stream always asks for its usage.

The result is validated by the chat schema itself, so the Messages API refuses
exactly what chat completions refuse (a 400 naming the field).
"""

from __future__ import annotations

import json

import msgspec

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.openai_schema import ChatCompletionRequest
from appliance.serving.anthropic.schema import (
    REFUSED,
    CountTokensRequest,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    TextBlock,
    Tool,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from appliance.serving.schema_limits import check_schema

#: Put before the text of a ``tool_result`` with ``is_error: true`` (chat messages have no error flag).
TOOL_ERROR_PREFIX = "Error: "


def chat_request(req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat completion that answers ``req`` (raises :class:`BadRequest` naming the field it cannot serve)."""
    if req.thinking is not None and req.thinking.type != "disabled":
        raise BadRequest(REFUSED["thinking"], param="thinking")
    body: JsonObject = {"model": req.model, "messages": _messages(req)}
    if req.output_config is not None and req.output_config.format is not None:
        check_schema(req.output_config.format.schema, "output_config.format")
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": req.output_config.format.schema},
        }
    tools, tool_choice, parallel = chat_tools(req.tools, req.tool_choice)
    if tools is not None:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        optional = {"stop": req.stop_sequences, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
        body.update({name: value for name, value in optional.items() if value is not None})
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # message_delta carries the usage
    try:
        return msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc)) from None


def _refusal(error: str) -> BadRequest:
    """The chat schema's refusal of a translated body, in the Messages API's terms."""
    chat_field = error.rsplit("`$.", 1)[-1].rstrip("`").split(".")[0].split("[")[0] if "`$." in error else None
    field = _FIELDS.get(chat_field or "", chat_field)
    return BadRequest(f"{error.split(' - at ')[0]} (parameter '{field}')" if field else error, param=field)


#: The Messages API's name for a chat field that a refusal names.
_FIELDS = {"stop": "stop_sequences", "response_format": "output_config", "parallel_tool_calls": "tool_choice"}


def _text(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


def _system(system: str | list[TextBlock] | None) -> str | None:
    if system is None:
        return None
    return system if isinstance(system, str) else _text(system)


#: Anthropic continues a last assistant message ("prefill"); the chat templates always open a new turn.
PREFILL_REFUSED = (
    "A last message from the assistant (a prefill to continue) is not supported: the chat templates always "
    "start a new assistant turn. End the conversation with a user message."
)


def _messages(req: MessagesRequest | CountTokensRequest) -> list[JsonObject]:
    if req.messages[-1].role == "assistant":
        raise BadRequest(PREFILL_REFUSED, param="messages")
    messages: list[JsonObject] = []
    system = _system(req.system)
    if system:
        messages.append({"role": "system", "content": system})
    for message in req.messages:
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            messages.append(_assistant(message))
        else:
            messages.extend(_user(message))
    return messages


def _refuse_image() -> BadRequest:
    return BadRequest(REFUSED["image"], param="messages")


def _assistant(message: InputMessage) -> JsonObject:
    texts: list[str] = []
    calls: list[JsonObject] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)},
                }
            )
        elif isinstance(block, ImageBlock):
            raise _refuse_image()
        else:
            raise BadRequest("tool_result blocks belong in user messages.", param="messages")
    out: JsonObject = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _user(message: InputMessage) -> list[JsonObject]:
    results: list[JsonObject] = []
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)})
        elif isinstance(block, ImageBlock):
            raise _refuse_image()
        else:
            raise BadRequest("tool_use blocks belong in assistant messages.", param="messages")
    if texts or not results:
        results.append({"role": "user", "content": "\n".join(texts)})
    return results


def _result_text(block: ToolResultBlock) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        if any(isinstance(part, ImageBlock) for part in content):
            raise _refuse_image()
        text = _text([part for part in content if isinstance(part, TextBlock)])
    return TOOL_ERROR_PREFIX + text if block.is_error else text


def chat_tools(
    tools: list[Tool] | None, choice: ToolChoice | None
) -> tuple[list[JsonObject] | None, str | JsonObject | None, bool | None]:
    """OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` for Anthropic's tools and tool_choice."""
    if isinstance(choice, ToolChoiceNone) or not tools:
        if isinstance(choice, (ToolChoiceAny, ToolChoiceTool)):
            raise BadRequest(
                f'tool_choice "{"any" if isinstance(choice, ToolChoiceAny) else "tool"}" needs tools.', param="tool_choice"
            )
        return None, None, None
    functions = []
    for index, tool in enumerate(tools):
        check_schema(tool.input_schema, f"tools[{index}].input_schema")
        function: JsonObject = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description:
            function["description"] = tool.description
        functions.append({"type": "function", "function": function})
    names = {tool.name for tool in tools}
    forced: str | JsonObject | None = None
    if isinstance(choice, ToolChoiceAny):
        forced = "required"
    elif isinstance(choice, ToolChoiceTool):
        if choice.name not in names:
            raise BadRequest(f"tool_choice names the tool `{choice.name}`, which is not in tools.", param="tool_choice")
        forced = {"type": "function", "function": {"name": choice.name}}
    disable = getattr(choice, "disable_parallel_tool_use", None)
    return functions, forced, (not disable) if disable is not None else None
