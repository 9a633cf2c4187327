"""Chat messages → prompt text, through the model's own chat template.

A GGUF's ``tokenizer.chat_template`` is code from an untrusted file
(CVE-2024-34359): it is rendered only in Jinja2's
``ImmutableSandboxedEnvironment``, and any error or sandbox violation becomes
a 400 — never a 500, never code execution. Models without a template get a
fallback chosen from the special tokens their vocabulary has (Gemma turns,
ChatML) or a plain ``role: content`` transcript.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .errors import ChatTemplateError

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = 'user' %}{% endif %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PLAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ m['role'] | capitalize }}: {{ m['content'] | trim }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


#: Stop strings that go with PLAIN_TEMPLATE: a base model continues the transcript.
PLAIN_STOPS = ["\n\nUser:", "\nUser:", "\n\nSystem:"]


def pick_fallback(has_token: Callable[[str], bool]) -> str:
    """Choose a template for a model without one.

    A GGUF without a chat template is almost always a base model. Measured on
    the default model (Gemma 3 270M base): Gemma turn markers make it echo the
    question and emit junk, while a plain "User:/Assistant:" transcript gets a
    real answer ("The capital of France is Paris."). So the plain transcript is
    the fallback, except for vocabularies built around ChatML markers.
    """
    if has_token("<|im_start|>") and has_token("<|im_end|>"):
        return CHATML_TEMPLATE
    return PLAIN_TEMPLATE


def _content_text(content: JsonValue) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise BadRequest("only text content parts are supported", param="messages")
        return "".join(parts)
    raise BadRequest("message content must be a string or a list of parts", param="messages")


def normalize_messages(messages: JsonValue) -> list[JsonObject]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a string role", param="messages")
        msg = dict(m)
        msg["content"] = _content_text(m.get("content"))
        if isinstance(m.get("tool_calls"), list):
            msg["tool_calls"] = [_call_with_object_arguments(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


def _call_with_object_arguments(call: JsonValue) -> JsonValue:
    """An assistant's tool call with its ``arguments`` JSON text decoded, as chat templates expect.

    OpenAI clients send arguments as a JSON string; templates (Qwen's, Llama's) write
    ``arguments | tojson`` and expect an object, as in Hugging Face's convention. Text
    that is not a JSON object stays as it is.
    """
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        return call
    if not isinstance(args, dict):
        return call
    return {**call, "function": {**fn, "arguments": args}}


class ChatRenderer:
    """Renders conversations with one compiled (sandboxed) template."""

    def __init__(self, template: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined, autoescape=False)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._error: str | None = None
        self._template: jinja2.Template | None
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateError as exc:  # a broken template: report on use, load anyway
            self._template = None
            self._error = f"the model's chat template does not compile: {exc.__class__.__name__}"

    def render(
        self,
        messages: list[JsonObject],
        *,
        tools: JsonValue = None,
        add_generation_prompt: bool = True,
        extra: JsonObject | None = None,
    ) -> str:
        if self._template is None:
            raise ChatTemplateError(self._error or "the model's chat template is unusable")
        ctx: JsonObject = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools is not None:
            ctx["tools"] = tools
        if extra:
            ctx.update(extra)
        try:
            return self._template.render(**ctx)
        except ChatTemplateError:
            raise
        except SecurityError:
            raise ChatTemplateError("the model's chat template tried an operation the sandbox forbids") from None
        except Exception as exc:  # template bugs are the model file's fault: 400, not 500
            raise ChatTemplateError(f"the model's chat template failed: {exc.__class__.__name__}: {exc}") from None


# -- what the template wrote vs. what the user wrote ------------------------------
#
# A message containing ``<end_of_turn>`` or ``<|im_end|>`` must not close its own
# turn. The conversation is rendered a second time with every free-text value
# (contents, reasoning, tool-call arguments) replaced by a sentinel made of Unicode
# noncharacters, which the standard reserves for internal use and which are
# removed from every request string first. The sentinels split that rendering into
# the template's own text (tokenised with special tokens parsed) and the user's
# text (tokenised as plain text). The plain rendering is used only to find how the
# template transformed each value (``| trim``, ``.split('</think>')[-1]``, …);
# whatever it finds, a user's text is never parsed for special tokens.

_NONCHAR = re.compile("[\ufdd0-\ufdef]")
_OPEN, _CLOSE, _DIGIT0 = "\ufdd0", "\ufdd1", 0xFDE0
_SENTINEL = re.compile("\ufdd0([\ufde0-\ufde9]+)\ufdd1|\\\\ufdd0((?:\\\\ufde[0-9])+)\\\\ufdd1")
#: Message fields holding free text: replaced by sentinels. Every other string
#: (roles, ids, names, tool definitions, template kwargs) is passed verbatim and
#: must not contain special-token text (the engine checks).
FREE_TEXT_FIELDS = ("content", "reasoning_content", "reasoning", "thinking")


@dataclass
class RenderedChat:
    #: (text, is_user_text) in prompt order
    segments: list[tuple[str, bool]]
    #: strings passed to the template verbatim (must hold no special-token text)
    verbatim: list[str]
    #: True when the segments reproduce the template's plain rendering exactly
    faithful: bool

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)


def _sentinel(i: int) -> str:
    return _OPEN + "".join(chr(_DIGIT0 + int(d)) for d in str(i)) + _CLOSE


def _tojson_str(s: str) -> str:
    """A string as Jinja's ``tojson`` writes it, without the quotes."""
    out = json.dumps(s)[1:-1]
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


def strip_nonchars(value: JsonValue) -> JsonValue:
    """``value`` with the sentinel characters (U+FDD0–U+FDEF) removed from every string."""
    if isinstance(value, str):
        return _NONCHAR.sub("", value)
    if isinstance(value, dict):
        return {strip_nonchars(k): strip_nonchars(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strip_nonchars(v) for v in value]
    return value


class _Masker:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.verbatim: list[str] = []

    def mask(self, s: str) -> str:
        if not s:  # empty text carries nothing, and templates test it for truth
            return s
        self.texts.append(s)
        return _sentinel(len(self.texts) - 1)

    def free(self, value: JsonValue) -> JsonValue:
        """Free text: every string leaf becomes a sentinel (dict keys stay, checked)."""
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, dict):
            self.verbatim.extend(k for k in value if isinstance(k, str))
            return {k: self.free(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.free(v) for v in value]
        return value

    def keep(self, value: JsonValue) -> JsonValue:
        """Structure passed verbatim: remember its strings for the special-token check."""
        if isinstance(value, str):
            self.verbatim.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                self.keep(k)
                self.keep(v)
        elif isinstance(value, list):
            for v in value:
                self.keep(v)
        return value

    def message(self, m: JsonObject) -> JsonObject:
        out: JsonObject = {}
        for k, v in m.items():
            self.keep(k)
            if k in FREE_TEXT_FIELDS:
                out[k] = self.free(v)
            elif k == "tool_calls" and isinstance(v, list):
                out[k] = [self.tool_call(c) for c in v]
            else:
                out[k] = self.keep(v)
        return out

    def tool_call(self, call: JsonValue) -> JsonValue:
        if not isinstance(call, dict):
            return self.keep(call)
        out: JsonObject = {}
        for k, v in call.items():
            self.keep(k)
            if k == "function" and isinstance(v, dict):
                out[k] = {fk: (self.free(fv) if fk == "arguments" else self.keep(fv)) for fk, fv in v.items()}
                self.keep(list(v))
            elif k == "arguments":  # some clients flatten the call
                out[k] = self.free(v)
            else:
                out[k] = self.keep(v)
        return out


def _candidates(text: str, escaped: bool) -> list[str]:
    """The forms a template commonly turns a value into, most faithful first."""
    bases = [text]
    if "</think>" in text:
        bases.append(text.split("</think>")[-1])
    seen: dict[str, None] = {}
    for b in bases:
        for c in (b, b.strip(), b.lstrip(), b.rstrip(), b.strip("\n"), b.lstrip("\n"), b.rstrip("\n")):
            seen.setdefault(_tojson_str(c) if escaped else c, None)
    return list(seen)


def _locate(plain: str, pieces: list[tuple[str, int, bool]], texts: list[str]) -> list[tuple[str, bool]] | None:
    """Match the sentinel rendering's pieces against the plain rendering, or None."""
    pos = 0
    out: list[tuple[str, bool]] = []
    for n, (text, idx, escaped) in enumerate(pieces):
        if idx < 0:
            if not plain.startswith(text, pos):
                return None
            out.append((text, False))
            pos += len(text)
            continue
        following = pieces[n + 1][0] if n + 1 < len(pieces) and pieces[n + 1][1] < 0 else ""
        for cand in _candidates(texts[idx], escaped):
            if plain.startswith(cand, pos) and plain.startswith(following, pos + len(cand)):
                out.append((cand, True))
                pos += len(cand)
                break
        else:
            return None
    return out if pos == len(plain) else None


def render_chat(
    renderer: ChatRenderer,
    messages: list[JsonObject],
    *,
    tools: JsonValue = None,
    add_generation_prompt: bool = True,
    extra: JsonObject | None = None,
) -> RenderedChat:
    """Render a conversation as template text and user text, kept apart."""
    messages = strip_nonchars(messages)
    tools = strip_nonchars(tools)
    extra = strip_nonchars(extra)
    masker = _Masker()
    masked = [masker.message(m) for m in messages]
    masker.keep(tools)
    masker.keep(extra)
    with_sentinels = renderer.render(masked, tools=tools, add_generation_prompt=add_generation_prompt, extra=extra)
    plain = renderer.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, extra=extra)
    pieces: list[tuple[str, int, bool]] = []  # (template text, -1, _) or (sentinel, index, json-escaped)
    pos = 0
    for m in _SENTINEL.finditer(with_sentinels):
        if m.start() > pos:
            pieces.append((with_sentinels[pos : m.start()], -1, False))
        raw = m.group(1)
        digits = raw if raw is not None else m.group(2).replace("\\ufde", "")
        idx = int("".join(str(ord(c) - _DIGIT0) for c in digits)) if raw is not None else int(digits)
        pieces.append((m.group(0), idx if idx < len(masker.texts) else -2, raw is None))
        pos = m.end()
    if pos < len(with_sentinels):
        pieces.append((with_sentinels[pos:], -1, False))
    pieces = [p for p in pieces if p[1] != -2 and (p[1] >= 0 or p[0])]
    if any(idx < 0 and _NONCHAR.search(text) for text, idx, _ in pieces):
        # The template cut into a value (slicing, say): its text cannot be told
        # apart from the template's, so refuse rather than guess.
        raise ChatTemplateError(
            "the model's chat template rewrites message contents in a way that cannot be kept apart from its own text"
        )
    located = _locate(plain, pieces, masker.texts)
    if located is not None:
        return RenderedChat(located, masker.verbatim, True)
    # The template did something to a value that we cannot retrace: keep the
    # sentinel rendering's split, with each value as given (safe, maybe less faithful).
    segments = [
        (text, False) if idx < 0 else ((_tojson_str(masker.texts[idx]) if escaped else masker.texts[idx]), True)
        for text, idx, escaped in pieces
    ]
    return RenderedChat(segments, masker.verbatim, False)
