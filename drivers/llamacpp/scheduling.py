"""Prefill scheduling: which slot a new prompt takes (the prefix cache), and the rate-based step pacer.

Prefix cache: a slot keeps the tokens of its last request in KV after it
finishes. A new prompt takes the free slot sharing the longest prefix with it
and only prefills the rest; if a busy slot shares a longer prefix, its cells
are shared into the new slot with ``llama_memory_seq_cp``.

Step pacing by rate (:class:`StepPacer`): how many tokens a piece of work may
carry is set by time, from the rate learned from the steps already run. The
embedding queue sizes its groups with it (about :data:`BUSY_STEP_S`), and the step planner
(:mod:`.step_planner`) falls back on it until its step-cost model has seen
enough steps.
"""

from __future__ import annotations

import math

from .context import DecodeContext
from .sequence import Sequence, Slot

#: Target length of an embedding group: generating sequences, and a request arriving meanwhile, wait about this long.
BUSY_STEP_S = 0.1
#: Weight of the newest step in the learned rate.
RATE_WEIGHT = 0.3
#: Steps with fewer tokens than this say more about fixed costs than about the rate; they are not learned from.
MIN_RATE_SAMPLE = 8


class StepPacer:
    """Tokens per step for a target step time, from a learned rate (tokens per second).

    ``observe`` feeds it each step's tokens and seconds (an exponentially weighted
    mean, so it follows the box as its load changes); ``tokens`` turns a target
    time into a token count within ``[floor, ceiling]``. Until a step was seen the
    answer is ``floor``: the first steps are short and measure the rate.
    """

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.rate: float | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < MIN_RATE_SAMPLE or seconds <= 0.0:
            return
        rate = tokens / seconds
        self.rate = rate if self.rate is None else (1 - RATE_WEIGHT) * self.rate + RATE_WEIGHT * rate

    def tokens(self, seconds: float, ceiling: int) -> int:
        if self.rate is None:
            return min(self.floor, ceiling)
        return max(min(self.floor, ceiling), min(ceiling, math.floor(self.rate * seconds)))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Places new prompts in the slots of one decode context, reusing the KV they already hold."""

    def __init__(self, context: DecodeContext, slots: list[Slot], n_swa: int) -> None:
        self._context = context
        self._slots = slots
        self._n_swa = n_swa

    def place(self, seq: Sequence, free: list[Slot]) -> Slot:
        """Pick the free slot with the longest cached prefix; reuse or share KV; set ``seq.cached``."""
        prompt = seq.prompt
        limit = len(prompt) - 1  # the last prompt token is always decoded (its logits are needed)
        if seq.scores_prompt:
            limit = 0  # every position's logits are needed: the whole prompt is decoded
        best, best_len = free[0], -1
        for s in free:
            n = min(common_prefix(s.tokens, prompt), limit)
            if n > best_len or (n == best_len and s.last_used < best.last_used):
                best, best_len = s, n
        donor, donor_len = None, best_len
        for s in self._slots:
            if s is not best and s.tokens:
                n = min(common_prefix(s.tokens, prompt), limit)
                if n > donor_len:
                    donor, donor_len = s, n
        context, sid = self._context, best.id
        if donor is not None:
            context.drop(sid)
            context.copy(donor.id, sid, donor_len)
            best.tokens = donor.tokens[:donor_len]
            n = donor_len
        else:
            n = best_len
            if not context.drop(sid, n):
                context.drop(sid)
                n = 0
            del best.tokens[n:]
        n_swa = self._n_swa
        # Sliding-window layers may have dropped cells the reused prefix still needs.
        if n > 0 and n_swa > 0 and context.first_position(sid) > max(0, n - n_swa):
            context.drop(sid)
            best.tokens = []
            n = 0
        seq.cached = n
        return best
