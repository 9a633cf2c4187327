"""Drawing each sequence's next token from its row of logits.

Greedy sequences without penalties or grammar take the argmax of their row with
numpy, after adding their logit bias to it in place: the same token libllama's
greedy sampler picks (the first of equal maxima), without the copy of the whole
vocabulary into a candidates array that ``llama_sampler_sample`` makes for every
token (about half a millisecond per token with a 262k vocabulary; ~40 µs this
way). Other plain chains sample inside libllama on the decode thread. Grammars take a fast
path: the chain picks freely and the one token is checked against the
stand-alone grammar. Grammar sampling that needs the whole vocabulary filtered
(a free choice broke the grammar, or a chain with penalties holds the grammar)
runs in a helper thread on a copy of the logits row: libllama's grammar check
costs milliseconds to seconds per token with large grammars and releases the
GIL. The sequence skips steps until its token is back; the others keep decoding.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llama_cpp.llama_cpp as ll
import numpy as np

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
        self._one_data = (ll.llama_token_data * 1)()
        self._one = self._one_data[0]
        self._one_arr = ll.llama_token_data_array(self._one_data, 1, -1, False)
        self._one_ref = ctypes.byref(self._one_arr)

    def sample(self, slot: Slot, idx: int) -> int:
        """The sampled token, or -1 when it is being sampled in the helper thread."""
        seq = slot.seq
        if seq.argmax and seq.logprobs is None:
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, idx), shape=(self._n_vocab,))
            if seq.bias is not None:
                row[seq.bias[0]] += seq.bias[1]
            if seq.ban_first and seq.ban_ids is not None:
                row[seq.ban_ids] -= FIRST_TOKEN_BAN
            return int(row.argmax())
        if seq.chain_grammar:
            self._defer(slot, idx, None)
            return -1
        t = ll.llama_sampler_sample(seq.chain, self._ctx, idx)
        g = seq.grammar
        if g is None:
            return t if seq.logprobs is None else self._staged(slot, idx, t)
        one = self._one
        one.id, one.logit, one.p = t, 0.0, 0.0
        arr = self._one_arr
        arr.size, arr.selected, arr.sorted = 1, -1, False
        ll.llama_sampler_apply(g, self._one_ref)
        if one.logit != -math.inf:
            ll.llama_sampler_accept(g, t)
            return t if seq.logprobs is None else self._staged(slot, idx, t)
        # the free choice breaks the grammar: filter the whole vocabulary, then sample
        self._defer(slot, idx, g)
        return -1

    def _staged(self, slot: Slot, idx: int, t: int) -> int:
        """``t``, after staging its log-probabilities from logits row ``idx`` (requests that asked only)."""
        slot.seq.logprobs.stage(logits_row(self._ctx, idx, self._n_vocab), t)
        return t

    def _defer(self, slot: Slot, idx: int, grammar) -> None:
        """Sample ``slot``'s token from a copy of logits row ``idx`` in the helper thread.

        With ``grammar`` (stand-alone), the grammar filters the vocabulary, the
        chain picks, and the grammar accepts the pick; without, the chain holds
        the grammar and does all three. The slot takes no part in steps until
        the token is back.
        """
        n_vocab = self._n_vocab
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, idx), shape=(n_vocab,)).copy()
        chain = slot.seq.chain
        recorder = slot.seq.logprobs

        def work() -> int:
            data = (ll.llama_token_data * n_vocab)()
            view = np.ctypeslib.as_array(data).view(np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
            view["id"] = np.arange(n_vocab, dtype=np.int32)
            view["logit"] = logits
            arr = ll.llama_token_data_array(data, n_vocab, -1, False)
            ref = ctypes.byref(arr)
            if grammar is not None:
                ll.llama_sampler_apply(grammar, ref)
            ll.llama_sampler_apply(chain, ref)
            if arr.selected < 0 or arr.selected >= arr.size:
                raise DecodeFailure("the grammar allows no token here")
            t = int(data[arr.selected].id)
            ll.llama_sampler_accept(grammar if grammar is not None else chain, t)
            if recorder is not None:
                recorder.stage(logits, t)
            return t

        fut = self._pool.submit(work)
        slot.job = fut
        fut.add_done_callback(lambda f: self._on_sampled(slot, f))

    def close(self) -> None:
        """Wait for the helper thread to finish its token."""
        self._pool.shutdown(wait=True)
