"""Drawing each sequence's next token from its row of logits.

Greedy sequences without penalties or grammar take the argmax of their row with
numpy, after adding their logit bias to it in place: the same token libllama's
greedy sampler picks (the first of equal maxima), without the copy of the whole
vocabulary into a candidates array that ``llama_sampler_sample`` makes for every
token (about half a millisecond per token with a 262k vocabulary; ~40 µs this
way). Other chains sample inside libllama on the decode thread. A constrained
sequence (``response_format``, a forced tool call) first has llguidance's mask
of allowed tokens applied to its row (disallowed logits to -inf; a few tenths of
a millisecond per token, bounded by llguidance's per-step fuel, :mod:`.constraint`),
then its chain picks from what is left and the pick is fed to the matcher. Once
the grammar is complete the sequence's next token is an end-of-generation token.
A grammar failure ends that sequence with an error through the helper thread's
hand-back, as a deferred token would.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llama_cpp.llama_cpp as ll
import numpy as np

from .constraint import Constraint
from .errors import DecodeFailure
from .logprobs import logits_row
from .sampling import FIRST_TOKEN_BAN
from .sequence import Slot


class TokenSampler:
    """Samples the tokens of one decode context's slots; deferred ones come back through ``on_sampled``.

    ``on_sampled(slot, future)`` runs in the helper thread once a deferred token is drawn.
    """

    def __init__(self, ctx: ll.llama_context_p, n_vocab: int, on_sampled: Callable[[Slot, Future[int]], None]) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._on_sampled = on_sampled
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-grammar")

    def sample(self, slot: Slot, idx: int) -> int:
        """The sampled token, or -1 when it is being sampled in the helper thread."""
        seq = slot.serving
        if seq.argmax and seq.logprobs is None:
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, idx), shape=(self._n_vocab,))
            if seq.bias is not None:
                row[seq.bias[0]] += seq.bias[1]
            if seq.ban_first and seq.ban_ids is not None:
                row[seq.ban_ids] -= FIRST_TOKEN_BAN
            return int(row.argmax())
        c = seq.grammar
        if c is not None:
            return self._constrained(slot, idx, c)
        t = ll.llama_sampler_sample(seq.chain, self._ctx, idx)
        return t if seq.logprobs is None else self._staged(slot, idx, t)

    def _constrained(self, slot: Slot, idx: int, c: Constraint) -> int:
        """Mask logits row ``idx`` with the grammar, sample from it, feed the pick to the grammar."""
        if c.stopped:
            if c.error:
                return self._fail(slot, c.error)
            return c.end_token  # the grammar is complete: the answer ends
        row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, idx), shape=(self._n_vocab,))
        if not c.apply(row):
            return self._fail(slot, c.error)
        seq = slot.serving
        t = ll.llama_sampler_sample(seq.chain, self._ctx, idx)
        if not c.consume(t):
            return self._fail(slot, c.error or "the grammar allows no token here")
        return t if seq.logprobs is None else self._staged(slot, idx, t)

    def _staged(self, slot: Slot, idx: int, t: int) -> int:
        """``t``, after staging its log-probabilities from logits row ``idx`` (requests that asked only)."""
        recorder = slot.serving.logprobs
        assert recorder is not None  # staged only for requests that asked for log-probabilities
        recorder.stage(logits_row(self._ctx, idx, self._n_vocab), t)
        return t

    def _fail(self, slot: Slot, error: str) -> int:
        """End ``slot``'s sequence with ``error``, handed back like a token sampled in the helper thread."""

        def work() -> int:
            raise DecodeFailure(f"structured output failed: {error}")

        fut = self._pool.submit(work)
        slot.job = fut
        fut.add_done_callback(lambda f: self._on_sampled(slot, f))
        return -1

    def close(self) -> None:
        """Wait for the helper thread to finish its token."""
        self._pool.shutdown(wait=True)
