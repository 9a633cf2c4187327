"""The engine facade: one loaded model, its batcher, and request preparation.

Turns parsed OpenAI requests into :class:`Sequence` objects (prompt tokens,
sampler chain, limits) and embedding inputs into token lists. Everything that
can be refused is refused here, before a slot is taken.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .batcher import Batcher
from .chat import PLAIN_STOPS, PLAIN_TEMPLATE, ChatRenderer, pick_fallback, render_chat
from .errors import ContextLengthExceeded, GrammarError
from .model import LoadedModel
from .protocol import GenRequest
from .sampling import build_chain, build_grammar, free_chain, has_penalties
from .sequence import Sequence

#: Most inputs in one /v1/embeddings request (OpenAI allows 2048; each input is a pooled
#: sequence, and 512 short inputs take seconds of engine time on two cores).
MAX_EMBEDDING_INPUTS = 512


def _text_bytes(req: GenRequest) -> int:
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


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker serves: its command line, parsed."""

    model_path: str
    served_name: str
    ctx: int = 4096
    parallel: int = 4
    threads: int = 2
    n_gpu_layers: int = 0
    batch_size: int = 256
    spec_ngram: int = 0
    embedding: bool = False


class WorkerEngine:
    """The worker's model and batcher, and the preparation of every request for them."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.model = LoadedModel(cfg.model_path, n_gpu_layers=cfg.n_gpu_layers)
        try:
            info = self.model.info
            bos = self.model.token_text(info.bos) if info.bos >= 0 else ""
            eos = self.model.token_text(info.eos) if info.eos >= 0 else ""
            template = info.chat_template or pick_fallback(lambda t: self.model.single_token(t) is not None)
            self.chat = ChatRenderer(template, bos_token=bos, eos_token=eos)
            self.has_template = info.chat_template is not None
            self.chat_stops = PLAIN_STOPS if template is PLAIN_TEMPLATE else []
            self._eog = self.model.eog_tokens() if not cfg.embedding else []
            self.max_token_bytes = self._longest_token()
            self.batcher = Batcher(self.model, ctx=cfg.ctx, parallel=cfg.parallel, threads=cfg.threads,
                                   batch_size=cfg.batch_size, spec_ngram=cfg.spec_ngram,
                                   embedding_only=cfg.embedding)
        except BaseException:
            self.model.close()
            raise

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.batcher.start(loop)

    def close(self) -> None:
        self.batcher.close()
        self.model.close()

    def _longest_token(self) -> int:
        """Bytes of the longest token text in the vocabulary (an upper bound on bytes per token)."""
        import llama_cpp.llama_cpp as ll

        vocab, longest = self.model.vocab, 1
        for t in range(self.model.info.n_vocab):
            raw = ll.llama_vocab_get_text(vocab, t)
            if raw and len(raw) > longest:
                longest = len(raw)
        return longest

    def _precheck(self, req: GenRequest) -> None:
        """Refuse a prompt whose text alone cannot fit the context, before rendering or tokenising it.

        A token's text is at most :attr:`max_token_bytes` long, so text of more than
        ``ctx × max_token_bytes`` bytes needs more than ``ctx`` tokens.
        """
        limit = self.cfg.ctx * self.max_token_bytes
        n = _text_bytes(req)
        if n > limit:
            raise ContextLengthExceeded(
                f"the prompt has {n} bytes of text, more than {self.cfg.ctx} tokens can hold;"
                f" this model's context per request is {self.cfg.ctx} tokens",
                param="messages" if req.kind == "chat" else "prompt")

    # -- generation -----------------------------------------------------------
    def prompt_tokens(self, req: GenRequest) -> list[int]:
        if req.kind == "chat":
            return self.chat_tokens(req.messages or [], tools=req.tools, extra=req.template_kwargs)
        if req.prompt_tokens is not None:
            return req.prompt_tokens
        # A raw completion prompt is the key holder's own text, template included
        # (as in llama-server and vLLM): its special tokens are parsed.
        return self.model.tokenize(req.prompt_text or "", add_special=True, parse_special=True)

    def chat_tokens(self, messages: list[JsonObject], *, tools: JsonValue = None,
                    extra: JsonObject | None = None) -> list[int]:
        """A conversation's prompt ids: special tokens only where the chat template wrote them.

        Message contents, reasoning and tool-call arguments are tokenised as plain
        text; other strings the template receives verbatim (roles, ids, names, tool
        definitions, chat_template_kwargs) are refused if they hold special-token text.
        """
        rendered = render_chat(self.chat, messages, tools=tools, extra=extra)
        self._refuse_special_text(rendered.verbatim)
        return self.model.tokenize_parts(rendered.segments, add_special=True)

    def _refuse_special_text(self, strings: list[str]) -> None:
        unique = [s for s in dict.fromkeys(strings) if s]
        if not unique or not self.model.has_special_text("\n".join(unique)):
            return
        bad = next((s for s in unique if self.model.has_special_text(s)), None)
        if bad is None:  # only the joined text formed one
            return
        shown = (bad[:40] + "…") if bad and len(bad) > 40 else bad
        raise BadRequest("special-token text is allowed only in message contents (where it is plain text), "
                         f"not in roles, names, ids, tools or chat_template_kwargs: {shown!r}", param="messages")

    def prepare(self, req: GenRequest) -> Sequence:
        if self.cfg.embedding:
            raise BadRequest("this model is served for embeddings only", param="model")
        self._precheck(req)
        tokens = self.prompt_tokens(req)
        if not tokens:
            raise BadRequest("the prompt is empty", param="prompt")
        limit = self.cfg.ctx
        if len(tokens) >= limit:
            raise ContextLengthExceeded(
                f"the prompt has {len(tokens)} tokens; this model's context per request is {limit} tokens",
                param="messages" if req.kind == "chat" else "prompt")
        room = limit - len(tokens)
        max_new = room if req.max_tokens is None else min(req.max_tokens, room)
        ban = self._eog if req.kind == "chat" else None
        sp = req.sampling
        # Grammar fast path: sample freely, check the one token against the grammar,
        # and only filter the whole vocabulary when it was invalid. Needs a chain
        # whose accept() has no state (no penalties), since a rejected token was
        # already accepted by it.
        split = sp.grammar is not None and not has_penalties(sp)
        grammar = None
        try:
            if split:
                grammar = build_grammar(self.model.vocab, sp.grammar)
            chain = build_chain(self.model.vocab, self.model.info.n_vocab, sp, ban_first=ban, with_grammar=not split)
        except GrammarError as exc:
            free_chain(grammar)
            raise BadRequest(str(exc), param="response_format") from None
        plain_chat = req.kind == "chat" and bool(self.chat_stops)
        stops = req.stop + self.chat_stops if plain_chat else req.stop
        # Speculative drafts are verified inline; grammar sequences may sample in a helper thread.
        seq = Sequence(tokens, max_new, chain, stops, ban_first=bool(ban),
                       spec=self.cfg.spec_ngram > 0 and sp.grammar is None, lstrip=plain_chat)
        seq.grammar = grammar
        seq.chain_grammar = sp.grammar is not None and not split
        return seq

    # -- embeddings -------------------------------------------------------------
    def embedding_inputs(self, body: JsonValue) -> list[list[int]]:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        inp = body.get("input")
        if isinstance(inp, str):
            items: list[JsonValue] = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(t, int) and not isinstance(t, bool) for t in inp):
            items = [inp]
        elif isinstance(inp, list) and inp:
            items = inp
        else:
            raise BadRequest("input must be a non-empty string, list of strings, or token ids", param="input")
        if len(items) > MAX_EMBEDDING_INPUTS:
            raise BadRequest(f"at most {MAX_EMBEDDING_INPUTS} inputs per request (this request has {len(items)})",
                             param="input")
        n_vocab = self.model.info.n_vocab
        out: list[list[int]] = []
        for it in items:
            if isinstance(it, str):
                if len(it.encode("utf-8", "replace")) > max(512, self.cfg.ctx) * self.max_token_bytes:
                    raise ContextLengthExceeded(f"an input is longer than {max(512, self.cfg.ctx)} tokens can hold",
                                                param="input")
                toks = self.model.tokenize(it, add_special=True, parse_special=False)
            elif isinstance(it, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab
                                              for t in it):
                toks = list(it)
            else:
                raise BadRequest("each input must be a string or a list of token ids", param="input")
            if not toks:
                raise BadRequest("an input is empty", param="input")
            if len(toks) > max(512, self.cfg.ctx):
                raise ContextLengthExceeded(f"an input has {len(toks)} tokens; the limit is {max(512, self.cfg.ctx)}",
                                            param="input")
            out.append(toks)
        return out
