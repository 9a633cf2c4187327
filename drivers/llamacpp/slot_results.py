"""What a decode step's results do to the sequences: tokens accepted, prompts scored, slots released.

:class:`SlotResults` turns each sampled token into the text events the asyncio side
receives (stop strings, end of generation, length limits, logprobs marks) and frees
a slot when its sequence ends. It runs on the decode thread, called by the batcher's
step loop (:mod:`.batcher`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from llama_cpp.llama_cpp import llama_context_p

from .context import DecodeContext
from .logprobs import LogprobRecorder, logits_row
from .model import LoadedModel
from .sampling import drop_first_link
from .sequence import FINISH_CANCELLED, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, Event, Slot
from .speculation import verify
from .step_planner import Chunk
from .token_sampler import TokenSampler


class SlotResults:
    """Applies sampled tokens to their sequences; counts generated and speculative tokens in ``stats``."""

    def __init__(self, model: LoadedModel, n_ctx_slot: int, stats: dict[str, int]) -> None:
        self.model = model
        self.n_ctx_slot = n_ctx_slot
        self.stats = stats
        # (recorder, entries its sequence's text so far covers) for this step's events of logprobs requests
        self.marks: list[tuple[LogprobRecorder, int]] = []

    def take_marks(self) -> list[tuple[LogprobRecorder, int]]:
        marks, self.marks = self.marks, []
        return marks

    def score_prompts(self, ctx: llama_context_p, scored: list[Chunk], events: list[Event]) -> None:
        """Record the log-probabilities of prompt tokens read this step (echo with logprobs).

        The logits at position p score the token at p + 1. A sequence asking for no
        new tokens (scoring a prompt) is done once its prompt is read.
        """
        n_vocab = self.model.info.n_vocab
        for chunk in scored:
            slot, first, start, end = chunk.slot, chunk.first, chunk.start, chunk.end
            seq = slot.seq
            if seq is None:
                continue
            prompt = seq.prompt
            rows = [(logits_row(ctx, first + p - start, n_vocab), prompt[p + 1]) for p in range(start, min(end, len(prompt) - 1))]
            assert seq.logprobs is not None  # prompts are scored only for requests that asked for log-probabilities
            seq.logprobs.add_prompt(prompt[0], rows)
            if end == len(prompt) and seq.max_new == 0:
                self.finish(slot, FINISH_LENGTH, events)

    def verify(self, slot: Slot, context: DecodeContext, sampler: TokenSampler, events: list[Event]) -> None:
        """Check ``slot``'s drafts against the samples at their positions; drop the KV of rejected ones.

        The sequence's :class:`.speculation.DraftGate` counts the outcome: drafts that keep
        failing pause its drafting.
        """
        drafts, slot.drafts = slot.drafts, []
        idx, slot.out_idx = slot.out_idx, -1
        seq = slot.serving  # before verifying: a token that ends the sequence releases the slot
        kept = verify(slot, idx, drafts, sampler.sample, lambda s, t: self.accept(s, t, events))
        seq.drafting.record(len(drafts), kept, seq.n_gen)
        self.stats["spec_drafted_total"] += len(drafts)
        self.stats["spec_accepted_total"] += kept
        context.drop(slot.id, len(slot.tokens))  # positions past what the slot now holds

    def sampled_back(self, slot: Slot, fut: Future[int], events: list[Event]) -> None:
        slot.job = None
        if slot.seq is None:
            return
        exc = fut.exception()
        if exc is not None:
            self.finish(slot, FINISH_ERROR, events, error=str(exc))
            return
        if slot.serving.cancelled:
            self.finish(slot, FINISH_CANCELLED, events)
            return
        self.accept(slot, fut.result(), events)

    def accept(self, slot: Slot, t: int, events: list[Event]) -> bool:
        """Handle one sampled token; return True if the sequence continues."""
        seq = slot.serving
        if seq.ban_first:
            drop_first_link(seq.chain)
            seq.ban_first = False
        if seq.n_gen == 0:
            seq.t_first = time.perf_counter()
        seq.n_gen += 1
        self.stats["tokens_generated_total"] += 1
        model = self.model
        lp, marks = seq.logprobs, self.marks  # lp: only requests that asked for logprobs
        if model.is_eog(t):
            events.append((seq, seq.text.flush(), FINISH_STOP))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self.release(slot)
            return False
        if lp is not None:
            lp.commit()  # an output token (an end-of-generation token is not one)
        text, hit = seq.text.feed(model.piece(t))
        if hit:
            events.append((seq, text, FINISH_STOP))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self.release(slot)
            return False
        if seq.n_gen >= seq.max_new or len(slot.tokens) >= self.n_ctx_slot:
            events.append((seq, text + seq.text.flush(), FINISH_LENGTH))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self.release(slot)
            return False
        if text:
            events.append((seq, text, None))
            if lp is not None:  # the entries this event's text covers
                marks.append((lp, lp.mark()))
        slot.feed = t
        return True

    def release(self, slot: Slot) -> None:
        slot.serving.free_samplers()
        slot.seq = None
        slot.feed = -1
        slot.out_idx = -1
        slot.chunk_end = 0
        slot.last_used = time.monotonic()

    def finish(self, slot: Slot, reason: str, events: list[Event], *, error: str | None = None) -> None:
        seq = slot.seq
        if seq is None:
            return
        seq.error = error
        events.append((seq, "", reason))
        self.release(slot)
