"""From a parsed request to the prompt's token ids, as the engine will decode them.

:class:`PromptBuilder` renders chats with the model's own template and
tokenises with its vocabulary: message contents as plain text, special tokens
only where the template put them. The worker builds every prompt with it; the
daemon builds the same count with a vocabulary-only copy of the model
(:class:`PromptCounter`) to reserve a request's prompt tokens exactly before
it reaches the engine.
"""

from __future__ import annotations

import functools

import llama_cpp.llama_cpp as ll

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .chat import PLAIN_STOPS, PLAIN_TEMPLATE, ChatRenderer, pick_fallback, render_chat
from .errors import ContextLengthExceeded
from .model import LoadedModel
from .protocol import GenRequest, chat_prompt, completion_prompt


def text_bytes(req: GenRequest) -> int:
    """UTF-8 bytes of the user-supplied text a prompt is made of (stripped: templates may trim)."""
    if req.kind != "chat":
        return len((req.prompt_text or "").strip().encode("utf-8", "replace"))
    n = 0
    for m in req.messages or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content.strip().encode("utf-8", "replace"))
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    n += len(text.strip().encode("utf-8", "replace"))
    return n


def longest_token(model: LoadedModel) -> int:
    """Bytes of the longest token text in the vocabulary (an upper bound on bytes per token)."""
    vocab, longest = model.vocab, 1
    for t in range(model.info.n_vocab):
        raw = ll.llama_vocab_get_text(vocab, t)
        if raw and len(raw) > longest:
            longest = len(raw)
    return longest


class PromptBuilder:
    """One model's chat template and tokenizer, applied to parsed requests."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        info = model.info
        bos = model.token_text(info.bos) if info.bos >= 0 else ""
        eos = model.token_text(info.eos) if info.eos >= 0 else ""
        template = info.chat_template or pick_fallback(lambda t: model.single_token(t) is not None)
        self.chat = ChatRenderer(template, bos_token=bos, eos_token=eos)
        self.chat_stops = PLAIN_STOPS if template is PLAIN_TEMPLATE else []

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """Bytes of the vocabulary's longest token text (scanned once, on first use)."""
        return longest_token(self.model)

    def precheck(self, req: GenRequest, ctx: int) -> None:
        """Refuse a prompt whose text alone cannot fit ``ctx`` tokens, before rendering or tokenising it.

        A token's text is at most :attr:`max_token_bytes` long, so text of more than
        ``ctx × max_token_bytes`` bytes needs more than ``ctx`` tokens.
        """
        n = text_bytes(req)
        if n > ctx * self.max_token_bytes:
            raise ContextLengthExceeded(
                f"the prompt has {n} bytes of text, more than {ctx} tokens can hold;"
                f" this model's context per request is {ctx} tokens",
                param="messages" if req.kind == "chat" else "prompt",
            )

    def prompt_tokens(self, req: GenRequest) -> list[int]:
        if req.kind == "chat":
            return self.chat_tokens(req.messages or [], tools=req.tools, extra=req.template_kwargs)
        if req.prompt_tokens is not None:
            return req.prompt_tokens
        # A raw completion prompt is the key holder's own text, template included
        # (as in llama-server and vLLM): its special tokens are parsed.
        return self.model.tokenize(req.prompt_text or "", add_special=True, parse_special=True)

    def chat_tokens(self, messages: list[JsonObject], *, tools: JsonValue = None, extra: JsonObject | None = None) -> list[int]:
        """A conversation's prompt ids: special tokens only where the chat template wrote them.

        Message contents, reasoning and tool-call arguments are tokenised as plain
        text; other strings the template receives verbatim (roles, ids, names, tool
        definitions, chat_template_kwargs) are refused if they hold special-token text.
        """
        rendered = render_chat(self.chat, messages, tools=tools, extra=extra)
        self._refuse_special_text(rendered.verbatim)
        return self.model.tokenize_parts(rendered.segments, add_special=True)

    def input_tokens(self, text: str) -> list[int]:
        """An embedding input's ids (plain text)."""
        return self.model.tokenize(text, add_special=True, parse_special=False)

    def _refuse_special_text(self, strings: list[str]) -> None:
        unique = [s for s in dict.fromkeys(strings) if s]
        if not unique or not self.model.has_special_text("\n".join(unique)):
            return
        bad = next((s for s in unique if self.model.has_special_text(s)), None)
        if bad is None:  # only the joined text formed one
            return
        shown = (bad[:40] + "…") if bad and len(bad) > 40 else bad
        raise BadRequest(
            "special-token text is allowed only in message contents (where it is plain text), "
            f"not in roles, names, ids, tools or chat_template_kwargs: {shown!r}",
            param="messages",
        )


class PromptCounter:
    """The prompt tokens a request will cost on one GGUF model, counted as its engine will count them.

    Loads only the vocabulary and metadata (no weights). ``count`` returns
    ``None`` where the engine would refuse the request (it then says why). How
    long a text is worth counting is the caller's decision.
    """

    def __init__(self, path: str) -> None:
        self.model = LoadedModel(path, vocab_only=True)
        try:
            self.prompts = PromptBuilder(self.model)
        except BaseException:
            self.model.close()
            raise

    def count(self, endpoint: str, body: JsonObject) -> int | None:
        n_vocab = self.model.info.n_vocab
        try:
            if endpoint == "embeddings":
                return self._inputs(body.get("input"))
            req = GenRequest(kind="chat" if endpoint == "chat" else "completion", model="")
            if endpoint == "chat":  # the prompt only: sampling and grammars do not change its tokens
                chat_prompt(req, body)
            else:
                completion_prompt(req, body, n_vocab)
            return len(self.prompts.prompt_tokens(req))
        except BadRequest:
            return None

    def _inputs(self, inp: JsonValue) -> int | None:
        items = [inp] if isinstance(inp, str) or (isinstance(inp, list) and inp and isinstance(inp[0], int)) else inp
        if not isinstance(items, list):
            return None
        total = 0
        for it in items:
            if isinstance(it, str):
                total += len(self.prompts.input_tokens(it))
            elif isinstance(it, list):
                total += len(it)
            else:
                return None
        return total

    def close(self) -> None:
        self.model.close()
