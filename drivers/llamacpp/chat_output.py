"""A chat answer with structure: reasoning, content and tool calls, plain or streamed.

Wraps one request's :class:`.tool_calls.OutputParser` and :class:`.protocol.Shaper`:
content goes out as ordinary content chunks, the reasoning trace as
``delta.reasoning_content`` and every call as OpenAI streams it (a first fragment
with ``index``, ``id``, ``type``, ``function.name`` and empty ``arguments``, then
the arguments with ``index`` only). A response with calls finishes with
``tool_calls``; the trace's tokens are reported as
``usage.completion_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable

from appliance.jsontypes import JsonObject, JsonValue

from .logprobs import joined
from .protocol import Shaper
from .tool_calls import CALL, CONTENT, THINK_CLOSE, THINK_OPEN, OutputParser, Piece, ToolCall

FINISH_TOOL_CALLS = "tool_calls"


class ChatOutput:
    """One request's structured answer. ``count_tokens`` counts the trace's tokens (the model's tokenizer)."""

    def __init__(self, parser: OutputParser, shaper: Shaper, count_tokens: Callable[[str], int], thinks: bool) -> None:
        self.parser = parser
        self.shaper = shaper
        self._count = count_tokens
        self._thinks = thinks
        self._sent_calls = 0
        self._held: JsonObject | None = None  # logprobs of tokens whose text the parser still holds

    # -- streamed ----------------------------------------------------------------
    def chunks(self, text: str, logprobs: JsonObject | None = None) -> bytes:
        """SSE chunks for newly generated text; its tokens' ``logprobs`` ride on the next chunk sent.

        The parser may hold text back (a call not yet complete): its tokens' logprobs wait with it."""
        self._hold(logprobs)
        return self._shape(self.parser.feed(text))

    def last_chunks(self, text: str, finish: str, logprobs: JsonObject | None = None) -> tuple[bytes, str]:
        """SSE chunks for the last text (and every logprob still held), and the finish reason to report."""
        self._hold(logprobs)
        out = self._shape(self.parser.feed(text) + self.parser.flush())
        if self._held is not None:
            out += self.shaper.chunk("", self._take())
        return out, self.finish_reason(finish)

    def _hold(self, logprobs: JsonObject | None) -> None:
        if logprobs is not None:
            self._held = logprobs if self._held is None else joined(self._held, logprobs)

    def _take(self) -> JsonObject | None:
        held, self._held = self._held, None
        return held

    def _shape(self, pieces: list[Piece]) -> bytes:
        out = b""
        for kind, value in pieces:
            if kind == CONTENT:
                out += self.shaper.chunk(value, self._take())  # type: ignore[arg-type]
            elif kind == CALL:
                call: ToolCall = value  # type: ignore[assignment]
                index, self._sent_calls = self._sent_calls, self._sent_calls + 1
                head = call.as_openai(index)
                head["function"] = {"name": call.name, "arguments": ""}
                out += self.shaper.delta_chunk({"tool_calls": [head]}, self._take())
                out += self.shaper.delta_chunk({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
            else:
                out += self.shaper.delta_chunk({"reasoning_content": value}, self._take())
        return out

    # -- whole -------------------------------------------------------------------
    def message(self, text: str, finish: str) -> tuple[JsonObject, str]:
        """The assistant message for the whole generated text, and the finish reason to report."""
        pieces = self.parser.feed(text) + self.parser.flush()
        content = "".join(v for k, v in pieces if k == CONTENT)  # type: ignore[misc]
        calls = self.parser.calls
        message: JsonObject = {"role": "assistant", "content": None if calls and not content.strip() else content}
        if self.parser.reasoning or self._thinks:
            message["reasoning_content"] = self.parser.reasoning or None
        if calls:
            tool_calls: list[JsonValue] = [c.as_openai() for c in calls]
            message["tool_calls"] = tool_calls
        return message, self.finish_reason(finish)

    def finish_reason(self, finish: str) -> str:
        return FINISH_TOOL_CALLS if self.parser.calls and finish == "stop" else finish

    def reasoning_tokens(self, completion_tokens: int) -> int | None:
        """Tokens the trace took (at most ``completion_tokens``); None when the template does not think."""
        if not self._thinks:
            return None
        trace = self.parser.reasoning
        if not trace and not self.parser.closed_reasoning:
            return 0
        opened = THINK_OPEN if self.parser.opened_reasoning else ""
        n = self._count(opened + trace + (THINK_CLOSE if self.parser.closed_reasoning else ""))
        return min(n, completion_tokens)
