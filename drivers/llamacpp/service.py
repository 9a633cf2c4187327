"""The engine facade: one loaded model, its batcher, and request preparation.

Turns parsed OpenAI requests into :class:`Sequence` objects (prompt tokens,
sampler chain, limits) and embedding inputs into token lists. Everything that
can be refused is refused here, before a slot is taken.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import numpy as np

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue

from .batcher import Batcher
from .chat_output import ChatOutput
from .constraint import GrammarCompiler
from .contention import ContentionPolicy
from .errors import ContextLengthExceeded
from .latency import LatencyTargets
from .logprobs import LogprobRecorder
from .model import LoadedModel
from .params import GpuPlacement, KvSettings
from .prompts import PromptBuilder
from .protocol import GenRequest, Shaper
from .sampling import bias_arrays, build_chain, has_penalties
from .sequence import Sequence
from .tool_calls import THINK_CLOSE, THINK_OPEN, OutputParser, template_thinks, tool_format
from .tool_choice import forced_call_grammar, tool_names

#: Most inputs in one /v1/embeddings request (OpenAI allows 2048; each input is a pooled
#: sequence, and 512 short inputs take seconds of engine time on two cores).
MAX_EMBEDDING_INPUTS = 512


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
    gpu: GpuPlacement = GpuPlacement()
    kv: KvSettings = KvSettings()
    even_outputs: str = "auto"
    contention: ContentionPolicy = ContentionPolicy()
    targets: LatencyTargets = LatencyTargets()  # TTFT and TPOT targets per priority class (see .latency)


class WorkerEngine:
    """The worker's model and batcher, and the preparation of every request for them."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.model = LoadedModel(cfg.model_path, n_gpu_layers=cfg.n_gpu_layers, gpu=cfg.gpu)
        try:
            self.prompts = PromptBuilder(self.model)
            self.chat = self.prompts.chat
            self.chat_stops = self.prompts.chat_stops
            self.max_token_bytes = self.prompts.max_token_bytes
            self.tool_format = tool_format(self.chat.source)
            self.thinks = template_thinks(self.chat.source)
            for marker in [m for pair in self.tool_format.markers for m in pair if m] + [THINK_OPEN, THINK_CLOSE]:
                self.model.render_as_text(marker)  # markers the output parser must see
            self._eog = self.model.eog_tokens() if not cfg.embedding else []
            self.grammars = GrammarCompiler(self.model.vocab, self._eog, self.model.info.n_vocab)
            self.batcher = Batcher(
                self.model,
                ctx=cfg.ctx,
                parallel=cfg.parallel,
                threads=cfg.threads,
                batch_size=cfg.batch_size,
                spec_ngram=cfg.spec_ngram,
                embedding_only=cfg.embedding,
                kv=cfg.kv,
                even_outputs=cfg.even_outputs,
                contention=cfg.contention,
                targets=cfg.targets,
            )
        except BaseException:
            self.model.close()
            raise
        # llguidance's view of the vocabulary, built in the background once the engine is whole
        self._grammar_warm_up = None if cfg.embedding else self.grammars.warm_up()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.batcher.start(loop)

    def close(self) -> None:
        if self._grammar_warm_up is not None:
            self._grammar_warm_up.join()  # it reads the vocabulary: finish before the model is freed
        self.batcher.close()
        self.model.close()

    # -- generation -----------------------------------------------------------
    def prompt_tokens(self, req: GenRequest) -> list[int]:
        return self.prompts.prompt_tokens(req)

    def chat_tokens(self, messages: list[JsonObject], *, tools: JsonValue = None, extra: JsonObject | None = None) -> list[int]:
        """A conversation's prompt ids (see :meth:`.prompts.PromptBuilder.chat_tokens`)."""
        return self.prompts.chat_tokens(messages, tools=tools, extra=extra)

    def prepare(self, req: GenRequest) -> Sequence:
        if self.cfg.embedding:
            raise BadRequest("this model is served for embeddings only", param="model")
        self.prompts.precheck(req, self.cfg.ctx)
        tokens = self.prompt_tokens(req)
        if not tokens:
            raise BadRequest("the prompt is empty", param="prompt")
        limit = self.cfg.ctx
        if len(tokens) >= limit:
            raise ContextLengthExceeded(
                f"the prompt has {len(tokens)} tokens; this model's context per request is {limit} tokens",
                param="messages" if req.kind == "chat" else "prompt",
            )
        room = limit - len(tokens)
        max_new = room if req.max_tokens is None else min(req.max_tokens, room)
        ban = self._eog if req.kind == "chat" else None
        sp = req.sampling
        param = "response_format"
        if req.kind == "chat" and req.tools and req.tool_choice.forced:
            sp = replace(sp, grammar=forced_call_grammar(self.tool_format, req.tools, req.tool_choice, self._special_token))
            param = "tools"
        if req.ignore_eos:  # end-of-generation tokens can never be sampled, as llama-server and vLLM do it
            sp = replace(sp, logit_bias={**sp.logit_bias, **dict.fromkeys(self._eog, float("-inf"))})
        # The grammar is compiled here, off the decode thread, within llguidance's limits and a time budget.
        constraint = self.grammars.compile(sp.grammar, param) if sp.grammar is not None else None
        chain = build_chain(self.model.vocab, self.model.info.n_vocab, sp, ban_first=ban)
        plain_chat = req.kind == "chat" and bool(self.chat_stops)
        stops = req.stop + self.chat_stops if plain_chat else req.stop
        # Speculative drafts are verified inline; constrained sequences do not draft.
        seq = Sequence(
            tokens,
            max_new,
            chain,
            stops,
            ban_first=bool(ban),
            spec=self.cfg.spec_ngram > 0 and sp.grammar is None,
            lstrip=plain_chat,
        )
        seq.grammar = constraint
        if sp.greedy and sp.grammar is None and not has_penalties(sp):
            seq.argmax = True
            seq.bias = bias_arrays(sp.logit_bias)
            seq.ban_ids = np.array(ban, dtype=np.int64) if ban else None
        if req.logprobs is not None:
            seq.logprobs = LogprobRecorder(req.logprobs, prompt=req.echo)
        return seq

    def chat_output(self, req: GenRequest, prompt: list[int], shaper: Shaper) -> ChatOutput | None:
        """The parser of a chat answer's reasoning and tool calls; None when the answer is plain text."""
        if req.kind != "chat" or not (req.tools or self.thinks):
            return None
        opened = self.thinks and self.model.detokenize(prompt[-8:]).rstrip().endswith(THINK_OPEN)
        parser = OutputParser(
            self.tool_format if req.tools else None, thinks=self.thinks, in_reasoning=opened, names=tool_names(req.tools)
        )
        return ChatOutput(parser, shaper, self._count_tokens, self.thinks)

    def _special_token(self, text: str) -> int | None:
        """The id of the one special token that renders as ``text`` (a tool-call marker), or None."""
        ids = self.model.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1 and self.model.tokenize(text, add_special=False, parse_special=False) != ids:
            return ids[0]
        return None

    def _count_tokens(self, text: str) -> int:
        return len(self.model.tokenize(text, add_special=False, parse_special=True))

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
            raise BadRequest(f"at most {MAX_EMBEDDING_INPUTS} inputs per request (this request has {len(items)})", param="input")
        n_vocab = self.model.info.n_vocab
        out: list[list[int]] = []
        for it in items:
            if isinstance(it, str):
                if len(it.encode("utf-8", "replace")) > max(512, self.cfg.ctx) * self.max_token_bytes:
                    raise ContextLengthExceeded(
                        f"an input is longer than {max(512, self.cfg.ctx)} tokens can hold", param="input"
                    )
                toks = self.prompts.input_tokens(it)
            elif isinstance(it, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in it):
                toks = list(it)
            else:
                raise BadRequest("each input must be a string or a list of token ids", param="input")
            if not toks:
                raise BadRequest("an input is empty", param="input")
            if len(toks) > max(512, self.cfg.ctx):
                raise ContextLengthExceeded(
                    f"an input has {len(toks)} tokens; the limit is {max(512, self.cfg.ctx)}", param="input"
                )
            out.append(toks)
        return out
