"""Structured output on llguidance: a grammar compiled per request, a token mask per step.

``response_format`` and forced tool calls arrive as Lark grammars whose JSON parts
are ``%json{...}`` schemas (:mod:`.grammar`, :mod:`.tool_choice`). Each request's
grammar is compiled into an ``LLMatcher`` during request preparation, off the decode
thread, under llguidance's own limits (:data:`LIMITS`) and a time budget
(:data:`COMPILE_BUDGET_S`); the first mask is computed there too, so a lexer that
is costly to build costs its own request's preparation. During decoding a
:class:`Constraint` writes the mask of allowed tokens into a bitmask, the bitmask is
applied to the sequence's logits row (disallowed tokens to -inf) before the sampler
chain picks, and the pick is fed back to the matcher. Once the grammar is complete
only end-of-generation tokens are allowed, so the end of the grammar ends the answer.

Measured on the default model's 262k vocabulary (``tests/bench/bench_grammar_engines.py``):
compiling a realistic schema takes about a millisecond, a mask a few tenths of a
millisecond per token; the tokenizer view of the vocabulary is built once, in the
background when the engine starts (2-10 s of one core, ~110 MB), and a request that
comes earlier waits for it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab

from appliance.errors import BadRequest

#: Longest a grammar's compilation and first mask may take before the request is refused, in seconds.
COMPILE_BUDGET_S = 3.0
#: llguidance's own resource limits, tighter than its defaults where a request could ask for more work:
#: lexer fuel (~14k units per ms of mask work), Earley items per step, lexer states (1-2 kB each), grammar symbols.
LIMITS: dict[str, int] = {
    "max_items_in_row": 2_000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 50_000,
    "max_grammar_size": 200_000,
}
#: How schemas become grammars: JSON spaced as most text a model has read spaces it (``{"a": 1, "b": 2}``)
#: and no other whitespace (none a model could loop in); unsupported keywords (e.g. unknown ``format``
#: names) ignored, as the converters of other servers do.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def _short(error: str) -> str:
    """llguidance's message without its position prefix and source excerpt."""
    first = error.strip().splitlines()[0] if error.strip() else "the grammar could not be compiled"
    if first.startswith("at ") and ": " in first:
        first = first.split(": ", 1)[1]
    return first[:300]


class Constraint:
    """One sequence's grammar state: its matcher and the bitmask of the tokens allowed next."""

    __slots__ = ("_matcher", "_words", "_n_vocab", "_ready", "end_token")

    def __init__(self, matcher: LLMatcher, n_vocab: int, end_token: int) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._ready = False  # the bitmask holds the mask of the matcher's current state
        self.end_token = end_token  # sampled once the grammar is complete: the answer ends

    @property
    def error(self) -> str:
        return _short(self._matcher.get_error()) if self._matcher.is_error() else ""

    @property
    def stopped(self) -> bool:
        """The grammar is complete (or failed): nothing but the end of the answer may follow."""
        return self._matcher.is_stopped()

    def compute_mask(self) -> bool:
        """Compute the mask of the current state (llguidance drops the GIL meanwhile); False on a grammar error."""
        if not self._ready:
            w = self._words
            self._matcher.unsafe_compute_mask_ptr(w.ctypes.data, w.nbytes)
            self._ready = True
        return not self._matcher.is_error()

    def apply(self, row: np.ndarray) -> bool:
        """Set the logits of disallowed tokens in ``row`` to -inf; False on a grammar error."""
        if not self.compute_mask():
            return False
        allowed = np.unpackbits(self._words.view(np.uint8), count=self._n_vocab, bitorder="little").view(np.bool_)
        np.copyto(row, -np.inf, where=~allowed)
        return True

    def consume(self, token: int) -> bool:
        """Feed the sampled token to the matcher; False if the grammar does not allow it."""
        self._ready = False
        return self._matcher.consume_token(token)

    def close(self) -> None:
        """Drop the matcher (the sequence samples no more)."""
        self._matcher = None  # type: ignore[assignment]


class GrammarCompiler:
    """Compiles request grammars against one model's vocabulary (thread-safe; used from preparation threads)."""

    def __init__(self, vocab, eog: list[int], n_vocab: int) -> None:
        self._vocab = vocab
        self._eog = list(eog)
        self._n_vocab = n_vocab
        self._tokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()
        self._limits = LLParserLimits(**LIMITS, verbose_errors=False)  # type: ignore[arg-type]  # every limit is an int; the stub's first keyword is the bool

    def warm_up(self) -> threading.Thread:
        """Build the tokenizer view in a background thread (seconds of work), so that no request waits for it."""
        thread = threading.Thread(target=self.tokenizer, name="llguidance-tokenizer", daemon=True)
        thread.start()
        return thread

    def tokenizer(self) -> LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (it renders every token once)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = lltokenizer_from_vocab(self._vocab, n_vocab=self._n_vocab, eos_token=self._eog or None)
            return self._tokenizer

    def compile(self, grammar: str, param: str, *, budget_s: float = COMPILE_BUDGET_S) -> Constraint:
        """``grammar`` (Lark) compiled, its first mask computed; a 400 naming ``param`` if refused or over budget."""
        tokenizer = self.tokenizer()
        t0 = time.perf_counter()
        matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=self._limits)
        if matcher.is_error():
            raise BadRequest(f"{param}: {_short(matcher.get_error())}", param=param)
        constraint = Constraint(matcher, self._n_vocab, self._eog[0] if self._eog else 0)
        if not constraint.compute_mask():
            raise BadRequest(f"{param}: {constraint.error}", param=param)
        spent = time.perf_counter() - t0
        if spent > budget_s:
            raise BadRequest(f"{param}: the grammar took {spent:.1f} s to compile; the budget is {budget_s:g} s", param=param)
        return constraint
