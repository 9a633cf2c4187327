"""Speculative decoding by prompt lookup.

A generating sequence whose last tokens repeat an n-gram seen earlier in its
history proposes the tokens that followed it then; they are decoded in the same
step as the fed token and kept while the samples at their positions agree.
Drafts only pay off while the step is memory-bound: with many sequences
generating, the CPU is already compute-bound and verification costs more than
it saves (:data:`SPEC_MAX_SEQS`).
"""

from __future__ import annotations

from collections.abc import Callable

from .sequence import Slot

#: Speculative drafts are made only while at most this many sequences generate.
SPEC_MAX_SEQS = 2


def draft(slot: Slot, ngram: int, most: int, ctx_per_slot: int) -> list[int]:
    """Propose tokens by finding the latest n-gram earlier in this sequence's history."""
    seq = slot.serving
    hist = slot.tokens + [slot.feed]
    if len(hist) <= ngram:
        return []
    room = min(most, seq.max_new - seq.n_gen - 1, ctx_per_slot - len(hist) - 1)
    if room <= 0:
        return []
    key = hist[-ngram:]
    first = key[0]
    # scan backwards for the most recent earlier occurrence
    for i in range(len(hist) - ngram - 1, -1, -1):
        if hist[i] == first and hist[i : i + ngram] == key:
            return hist[i + ngram : i + ngram + room]
    return []


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
