"""Speculative decoding by prompt lookup.

A generating sequence whose last tokens repeat an n-gram seen earlier in its
history proposes the tokens that followed it then; they are decoded in the same
step as the fed token and kept while the samples at their positions agree.
Drafts only pay off while the step is memory-bound: with many sequences
generating, the CPU is already compute-bound and verification costs more than
it saves (:data:`SPEC_MAX_SEQS`).

What a draft costs sets the rest. Measured on the two-core test box with Gemma 3
270M (a 262k-token vocabulary, so every kept logits row pays a large output layer),
one sequence holding 400 tokens: one row 12.4 ms a decode, two rows 24.8 ms, four
31.3, six 38.7, eight 40.9, ten 51.3 (an odd count of three or more is padded to
even, see :mod:`.output_parity`). The first draft token doubles the step and the
next ones are cheap, so a short draft never pays (:data:`MIN_DRAFT`), a draft is
of odd length (:func:`draft_room`), and a sequence whose drafts keep failing pays
that doubling for nothing on every step: it stops drafting for a while
(:class:`DraftGate`). Shrinking the draft after a partly kept one gains nothing
(``tests/bench/sim_speculation.py``): the rows it saves are the cheap ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Slot

#: Speculative drafts are made only while at most this many sequences generate.
SPEC_MAX_SEQS = 2


def may_draft(generating: int, prompt_waiting: bool) -> bool:
    """Whether a step with ``generating`` streams drafts; never while an interactive prompt waits to be read.

    A draft adds rows to the step, and a step that reads a prompt beside it reads
    fewer tokens in its time: on the two-core box a 248-token chunk beside one
    stream's seven drafts took 620-670 ms against 570 ms beside the stream alone.
    The streams' own targets are met by the planner either way; the prompt's first
    token is what drafting would delay.
    """
    return 0 < generating <= SPEC_MAX_SEQS and not prompt_waiting


#: Fewest tokens worth drafting. One draft token makes a step of two rows (24.8 ms
#: against 12.4 for one) for at most two tokens, which two plain steps make as fast;
#: two make four rows after padding (31.3 ms) for at most three (37.2 ms plain), a
#: gain only when both are accepted. Three are the fewest that can win clearly.
MIN_DRAFT = 3

#: Drafted tokens a sequence's drafts are judged over: two full drafts, so one
#: unlucky draft does not pause a sequence that copies well.
JUDGE_WINDOW = 16
#: A window with fewer of its drafted tokens accepted pauses the sequence's drafting.
#: Break-even for one sequence drafting 7 tokens (eight rows, 40.9 ms): the step must
#: make 40.9 / 12.4 = 3.3 tokens, the fed one and 2.3 accepted, a third of the drafts.
MIN_ACCEPTANCE = 0.35
#: The first pause, in tokens generated; every window in a row that fails again
#: doubles it, up to :data:`MAX_PAUSE`, so prose that never repeats drafts ever
#: more rarely while text that turns repetitive later is still found.
FIRST_PAUSE = 16
MAX_PAUSE = 256


class DraftGate:
    """One sequence's record of its drafts, and whether it drafts now.

    The counters cover the whole sequence (``drafted``, ``accepted``) and the current
    judging window. Each window of at least :data:`JUDGE_WINDOW` drafted tokens is
    judged once: below :data:`MIN_ACCEPTANCE` the sequence pauses drafting for
    ``pause`` generated tokens and the next pause doubles; at or above it the pause
    length falls back to :data:`FIRST_PAUSE`.
    """

    __slots__ = ("drafted", "accepted", "window_drafted", "window_accepted", "pause", "resume_at")

    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0
        self.window_drafted = 0
        self.window_accepted = 0
        self.pause = FIRST_PAUSE
        self.resume_at = 0  # the generated-token count from which the sequence drafts again

    def open(self, generated: int) -> bool:
        """Whether a sequence that has generated ``generated`` tokens drafts this step."""
        return generated >= self.resume_at

    def record(self, drafted: int, accepted: int, generated: int) -> None:
        """Count one verified draft; ``generated``: the sequence's tokens generated after it."""
        self.drafted += drafted
        self.accepted += accepted
        self.window_drafted += drafted
        self.window_accepted += accepted
        if self.window_drafted < JUDGE_WINDOW:
            return
        if self.window_accepted < MIN_ACCEPTANCE * self.window_drafted:
            self.resume_at = generated + self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)
        else:
            self.pause = FIRST_PAUSE
        self.window_drafted = self.window_accepted = 0


def draft_room(most: int) -> int:
    """The most tokens one draft proposes: odd, so the fed token and its drafts keep an even count of rows.

    Eight drafts make nine rows, padded to ten (51.3 ms), for one token more than
    seven drafts make in eight rows (40.9 ms); the ninth row costs more than the
    token is worth unless nearly every draft is kept whole. Two sequences drafting
    seven each keep the step even too.
    """
    return most - 1 if most % 2 == 0 else most


def draft(slot: Slot, ngram: int, most: int, ctx_per_slot: int) -> list[int]:
    """Propose tokens by finding the latest n-gram earlier in this sequence's history.

    Nothing while the sequence's :class:`DraftGate` is closed or with room for fewer than
    :data:`MIN_DRAFT` tokens, and at most :func:`draft_room` of ``most``.
    """
    seq = slot.serving
    if not seq.drafting.open(seq.n_gen):
        return []
    hist = slot.tokens + [slot.feed]
    if len(hist) <= ngram:
        return []
    room = min(draft_room(most), seq.max_new - seq.n_gen - 1, ctx_per_slot - len(hist) - 1)
    if room < MIN_DRAFT:
        return []
    key = hist[-ngram:]
    first = key[0]
    # scan backwards for the most recent earlier occurrence
    for i in range(len(hist) - ngram - 1, -1, -1):
        if hist[i] == first and hist[i : i + ngram] == key:
            return continuation(hist, i + ngram, room)
    return []


def continuation(hist: list[int], start: int, room: int) -> list[int]:
    """``room`` tokens from ``hist[start]`` on, running on into themselves past the end of ``hist``.

    A match close to the end is a loop shorter than the draft ("the the the"): the tokens
    that followed it are the ones being drafted, so the copy goes on repeating the loop
    (as an overlapping copy does) instead of stopping short of :data:`MIN_DRAFT`.
    """
    out: list[int] = []
    for pos in range(start, start + room):
        out.append(hist[pos] if pos < len(hist) else out[pos - len(hist)])
    return out


def verify(
    slot: Slot, idx: int, drafts: list[int], sample: Callable[[Slot, int], int], accept: Callable[[Slot, int], bool]
) -> int:
    """Sample at the fed token (batch row ``idx``) and at each draft; keep drafts while they match.

    ``accept`` takes each sampled token and says whether the sequence goes on. Returns
    how many drafts were kept; their KV is right (they were decoded after correct tokens).
    """
    kept = 0
    for j in range(len(drafts) + 1):
        t = sample(slot, idx + j)
        if not accept(slot, t):
            break
        if j < len(drafts) and t == drafts[j]:
            slot.tokens.append(t)
            kept += 1
            continue
        break
    return kept
