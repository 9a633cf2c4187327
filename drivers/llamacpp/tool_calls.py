"""Tool calls and reasoning traces, parsed out of generated text as it streams.

A model announces a tool call in its family's syntax:

- Qwen / Hermes: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (one block per call);
- Llama 3.x: a JSON object ``{"name": …, "parameters": {…}}`` as the whole answer, or after
  ``<|python_tag|>``; several are separated by ``;``;
- Mistral: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``;
- anything else (generic): a JSON object ``{"name": …, "arguments": …}`` (or a list of them, or
  ``{"tool_calls": [...]}``) as the whole answer.

The format is chosen from the chat template's text (:func:`tool_format`). Reasoning
models write their trace between ``<think>`` and ``</think>`` (some templates open
``<think>`` in the generation prompt itself). :class:`OutputParser` splits the
stream into content, reasoning and calls; text that does not turn out to be a
call is given back as content, never dropped.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from appliance.jsontypes import JsonValue

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_SEPARATORS = " \t\r\n,;"


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes tool calls."""

    name: str
    #: (opening marker, closing marker or None): the text between holds one or more calls
    markers: tuple[tuple[str, str | None], ...] = ()
    #: a JSON call (or list of calls) as the whole answer counts as calls
    json_at_start: bool = False
    #: the key a call's arguments go under in the family's syntax
    arguments_key: str = "arguments"


HERMES = ToolFormat("hermes", (("<tool_call>", "</tool_call>"),))
LLAMA3 = ToolFormat("llama3", (("<|python_tag|>", None),), json_at_start=True, arguments_key="parameters")
MISTRAL = ToolFormat("mistral", (("[TOOL_CALLS]", None),), json_at_start=True)
GENERIC = ToolFormat("generic", (), json_at_start=True)


def tool_format(template: str | None) -> ToolFormat:
    """The call syntax a chat template teaches its model (generic JSON when it teaches none)."""
    text = template or ""
    if "<tool_call>" in text:
        return HERMES
    if "[TOOL_CALLS]" in text:
        return MISTRAL
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and "tools" in text):
        return LLAMA3
    return GENERIC


def template_thinks(template: str | None) -> bool:
    """True when the chat template knows ``<think>`` traces (R1 distills, Qwen3, …)."""
    if not template:
        return False
    return THINK_OPEN in template or THINK_CLOSE in template


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self, index: int | None = None) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out = {"index": index, **out}
        return out


def _one_call(value: JsonValue, names: frozenset[str]) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # OpenAI's own shape
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name or (names and name not in names):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # already a JSON string: keep it if it holds an object
        try:
            parsed = json.loads(args)
        except ValueError:
            return None
        return ToolCall(name, args) if isinstance(parsed, dict) else None
    if not isinstance(args, dict):
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def calls_from_json(value: JsonValue, names: frozenset[str] = frozenset()) -> list[ToolCall] | None:
    """The calls a decoded JSON value holds, or None when it is not (only) calls.

    ``names``: the tools offered; a call to any other name is not a call.
    """
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_one_call(v, names) for v in items]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


# -- the incremental parser ---------------------------------------------------------

CONTENT, REASONING, CALL = "content", "reasoning", "call"
#: One parsed piece: ("content", text), ("reasoning", text) or ("call", ToolCall).
Piece = tuple[str, "str | ToolCall"]

_START, _REASONING, _TEXT, _REGION = range(4)
_DECODER = json.JSONDecoder()


def _held_prefix(buf: str, markers: list[str]) -> int:
    """Length of the longest tail of ``buf`` that is a proper prefix of a marker."""
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), keep, -1):
            if buf.endswith(m[:k]):
                keep = k
                break
    return keep


class OutputParser:
    """Splits generated text into content, reasoning and tool calls, fed piece by piece.

    ``fmt``: the call syntax, or None when no tools were offered. ``thinks``: the
    template knows ``<think>``; ``in_reasoning``: the prompt already opened it.
    ``names``: the offered tools' names.
    """

    def __init__(
        self, fmt: ToolFormat | None, *, thinks: bool = False, in_reasoning: bool = False, names: frozenset[str] = frozenset()
    ) -> None:
        self.fmt = fmt
        self.names = names
        self._thinks = thinks
        self._state = _REASONING if in_reasoning else _START
        self._after_think = False
        self._buf = ""
        self._region_raw = ""  # text of the open call region, given back as content if it is no call
        self._region_end: str | None = None
        self._openers = [m for m, _ in fmt.markers] if fmt else []
        self.calls: list[ToolCall] = []
        self.reasoning = ""  # the whole trace so far (for counting its tokens)
        self.opened_reasoning = False  # the model wrote <think> itself
        self.closed_reasoning = False

    # -- public ------------------------------------------------------------------
    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return self._merge(out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self._state == _REGION:
            self._close_region(out)
        elif self._buf:
            kind = REASONING if self._state == _REASONING else CONTENT
            if not (kind == CONTENT and self._after_think and self._state == _START):
                self._emit(out, kind, self._buf)
        self._buf = ""
        return self._merge(out)

    # -- internals ---------------------------------------------------------------
    def _emit(self, out: list[Piece], kind: str, value: str | ToolCall) -> None:
        if kind == CALL:
            self.calls.append(value)  # type: ignore[arg-type]
        elif not value:
            return
        elif kind == REASONING:
            self.reasoning += value  # type: ignore[operator]
        out.append((kind, value))

    @staticmethod
    def _merge(out: list[Piece]) -> list[Piece]:
        merged: list[Piece] = []
        for kind, value in out:
            if merged and kind != CALL and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + value)  # type: ignore[operator]
            else:
                merged.append((kind, value))
        return merged

    def _step(self, out: list[Piece], *, final: bool) -> bool:
        """Advance the state machine once; False when it needs more text."""
        buf = self._buf
        if self._state == _REASONING:
            i = buf.find(THINK_CLOSE)
            if i >= 0:
                self._emit(out, REASONING, buf[:i])
                self._buf = buf[i + len(THINK_CLOSE) :]
                self._state, self._after_think, self.closed_reasoning = _START, True, True
                return True
            keep = _held_prefix(buf, [THINK_CLOSE]) if not final else 0
            self._emit(out, REASONING, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if self._state == _START:
            rest = buf.lstrip()
            if not rest:
                return False
            lead = buf[: len(buf) - len(rest)]
            if self._thinks and not self._after_think:
                if rest.startswith(THINK_OPEN):
                    self._buf, self._state = rest[len(THINK_OPEN) :], _REASONING
                    self.opened_reasoning = True
                    return True
                if THINK_OPEN.startswith(rest) and not final:
                    return False
            if not final and any(m.startswith(rest) and m != rest for m in self._openers):
                return False  # maybe a marker (Mistral's "[TOOL_CALLS]" opens like JSON)
            opens_marker = any(rest.startswith(m) for m in self._openers)
            if self.fmt and self.fmt.json_at_start and rest[0] in "{[" and not opens_marker:
                self._buf, self._state = rest, _REGION
                self._region_raw, self._region_end = lead, None
                return True
            self._buf, self._state = (rest if self._after_think else buf), _TEXT
            return True
        if self._state == _TEXT:
            if self.calls and not buf.strip():
                if final:
                    self._buf = ""  # whitespace between and after calls is no answer
                return False
            best, marker, end = -1, "", None
            for m, e in self.fmt.markers if self.fmt else ():
                i = buf.find(m)
                if i >= 0 and (best < 0 or i < best):
                    best, marker, end = i, m, e
            if best >= 0:
                if not (self.calls and not buf[:best].strip()):
                    self._emit(out, CONTENT, buf[:best])
                self._buf = buf[best + len(marker) :]
                self._state, self._region_raw, self._region_end = _REGION, marker, end
                return True
            keep = _held_prefix(buf, self._openers) if not final else 0
            if self.calls and not buf[: len(buf) - keep].strip():
                return False  # only whitespace so far: held until something follows
            self._emit(out, CONTENT, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        return self._step_region(out, final)

    def _step_region(self, out: list[Piece], final: bool) -> bool:
        buf = self._buf
        end = self._region_end
        if end is not None:  # the region's text is complete once its closing marker arrives
            j = buf.find(end)
            if j < 0:
                return False
            inner = buf[:j]
            calls = self._decode_all(inner)
            if calls is None:
                self._emit(out, CONTENT, self._region_raw + inner + end)
            else:
                for c in calls:
                    self._emit(out, CALL, c)
            self._buf, self._state, self._region_raw = buf[j + len(end) :], _TEXT, ""
            return True
        # No closing marker: calls follow each other until the text is something else.
        rest = buf.lstrip(_SEPARATORS)
        if not rest:
            return False
        if rest[0] not in "{[":
            if self._region_raw:  # a marker with no call after it: give back the marker and the gap
                self._region_raw += buf[: len(buf) - len(rest)]
            self._give_back_region(out, rest)
            return True
        try:
            value, n = _DECODER.raw_decode(rest)
        except ValueError:
            return False  # incomplete (or broken: decided at the end)
        calls = calls_from_json(value, self.names)
        if calls is None:
            self._give_back_region(out, rest)
            return True
        for c in calls:
            self._emit(out, CALL, c)
        self._buf, self._region_raw = rest[n:], ""
        return True

    def _give_back_region(self, out: list[Piece], rest: str) -> None:
        """The region turned out not to be (more) calls: its text is content."""
        if self._region_raw.strip():
            self._emit(out, CONTENT, self._region_raw)
        self._buf, self._state, self._region_raw = rest, _TEXT, ""

    def _close_region(self, out: list[Piece]) -> None:
        """End of generation inside a call region: decode what is there, else give it back."""
        buf = self._buf
        calls = self._decode_all(buf)
        if calls is None:
            self._emit(out, CONTENT, self._region_raw + buf)
        else:
            for c in calls:
                self._emit(out, CALL, c)
        self._buf, self._region_raw, self._state = "", "", _TEXT

    def _decode_all(self, text: str) -> list[ToolCall] | None:
        """Every JSON value in ``text`` (separated by whitespace, commas or semicolons) as calls, or None."""
        calls: list[ToolCall] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos] in _SEPARATORS:
                pos += 1
            if pos == len(text):
                return calls or None
            try:
                value, pos = _DECODER.raw_decode(text, pos)
            except ValueError:
                return None
            found = calls_from_json(value, self.names)
            if found is None:
                return None
            calls.extend(found)
