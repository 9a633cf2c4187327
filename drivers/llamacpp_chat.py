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
from collections.abc import Callable
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from appliance.errors import BadRequest

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


class ChatTemplateError(BadRequest):
    """The model's chat template failed, or tried something the sandbox forbids."""

    code = "chat_template_error"


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


def _content_text(content: Any) -> str:
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


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a string role", param="messages")
        msg = dict(m)
        msg["content"] = _content_text(m.get("content"))
        out.append(msg)
    return out


class ChatRenderer:
    """Renders conversations with one compiled (sandboxed) template."""

    def __init__(self, template: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined, autoescape=False
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._error: str | None = None
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateError as exc:  # a broken template: report on use, load anyway
            self._template = None
            self._error = f"the model's chat template does not compile: {exc.__class__.__name__}"

    def render(self, messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = True,
               extra: dict[str, Any] | None = None) -> str:
        if self._template is None:
            raise ChatTemplateError(self._error or "the model's chat template is unusable")
        ctx: dict[str, Any] = {
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
