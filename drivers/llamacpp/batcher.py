"""Continuous batching over one llama.cpp context.

One ``llama_context`` (:mod:`.context`) holds ``parallel`` sequences in a
unified KV cache. A dedicated thread runs the decode loop; each step is ONE
``llama_decode`` that carries the next token of every generating sequence
plus, within the batch budget, chunks of pending prompts (so long prefills
interleave with running streams). New requests join between steps, in the
slot :mod:`.scheduling` picks for them. Each step's results reach the asyncio
loop in ONE ``call_soon_threadsafe``.

Fairness: no request holds the decode thread for long.

- Prefill budget is shared max-min fairly among the prompts still being read
  (:func:`.scheduling.fair_shares`).
- Grammar sampling that needs the whole vocabulary filtered runs in a helper
  thread (:mod:`.token_sampler`); the sequence skips steps until its token is
  back, the others keep decoding.
- Steps are paced by time (:class:`.scheduling.StepPacer`): while any other
  sequence is generating or reading its prompt, a step carries about
  :data:`.scheduling.BUSY_STEP_S` of prompt reading, so a long prefill adds a
  bounded time to each of their tokens; a lone prompt is read in steps of about
  :data:`.scheduling.LONE_STEP_S`, so a request arriving meanwhile waits no longer.
- Embedding requests are embedded a bounded group at a time between decode
  steps (:class:`.embed.EmbedQueue`), paced the same way; while generation
  runs, embedding gets at most as much of the thread's time as decoding does.

Thread ownership: slots, the context, the batch and samplers belong to the
decode thread, and it alone computes graphs (the warm-up too: :mod:`.context`
says why a second computing thread slows every decode). The asyncio side only
appends to the incoming queues (under the condition's lock) and sets
``Sequence.cancelled``.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from concurrent.futures import Future

from .context import DecodeContext
from .embed import EmbedQueue
from .logprobs import PROMPT_ROWS_PER_STEP, LogprobRecorder, logits_row
from .model import LoadedModel
from .output_parity import calibrate
from .params import KvSettings
from .sampling import drop_first_link
from .scheduling import BUSY_STEP_S, LONE_STEP_S, PrefixCache, StepPacer, fair_shares
from .sequence import FINISH_CANCELLED, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, Event, Sequence, Slot
from .speculation import SPEC_MAX_SEQS, draft, verify
from .token_sampler import TokenSampler

#: Fewest prompt tokens a step reads, whatever the pacing says (and all a step reads before the rate is known).
MIN_PREFILL_TOKENS = 16


class Batcher:
    """The decode loop of one model: generation in ``parallel`` slots, embeddings between steps."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        ctx: int,
        parallel: int,
        threads: int,
        batch_size: int = 256,
        spec_ngram: int = 0,
        spec_draft: int = 8,
        embedding_only: bool = False,
        kv: KvSettings = KvSettings(),
        even_outputs: str = "auto",
    ) -> None:
        self.model = model
        self.n_ctx_slot = ctx
        self.parallel = parallel
        self.n_batch = max(batch_size, parallel * (1 + (spec_draft if spec_ngram else 0)))
        self.spec_ngram = spec_ngram
        self.spec_draft = spec_draft
        self.even_outputs_mode = even_outputs  # auto, on or off (see .output_parity)
        self.parity_us = (0, 0)  # the calibration's decode times of odd and even output rows
        self.slots = [Slot(i) for i in range(parallel)]
        self._incoming: collections.deque[Sequence] = collections.deque()
        self._embeds = EmbedQueue(model, ctx=max(512, ctx), n_seq=min(parallel, 16), threads=threads)
        self._sampled: collections.deque[tuple[Slot, Future[int]]] = collections.deque()  # helper-thread results
        # (recorder, entries its sequence's text so far covers) for this step's events of logprobs requests
        self._marks: list[tuple[LogprobRecorder, int]] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_s = 0.0  # time of whole steps (decode + Python scheduling and sampling)
        self._pacer = StepPacer(MIN_PREFILL_TOKENS)  # tokens per second of decode steps
        self.stats = {
            "tokens_generated_total": 0,
            "prompt_tokens_total": 0,
            "cached_tokens_total": 0,
            "spec_drafted_total": 0,
            "spec_accepted_total": 0,
        }
        # Steps that only decoded (no prompt tokens): how fast streams really decode, for the planner.
        self._decode_only = {"tokens": 0, "seconds": 0.0, "stream_seconds": 0.0}
        # An embedding-only batcher has no decode context: the engine never submits sequences to it.
        self.context: DecodeContext | None = None
        self._sampler: TokenSampler | None = None
        self._prefix: PrefixCache | None = None
        if not embedding_only:
            self.context = DecodeContext(model, ctx_per_slot=ctx, parallel=parallel, threads=threads, n_batch=self.n_batch, kv=kv)
            self._sampler = TokenSampler(self.context.ctx, model.info.n_vocab, self._sampled_ready)
            self._prefix = PrefixCache(self.context, self.slots, model.info.n_swa)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the decode thread; returns once it has warmed the context up (blocks: call it off the loop)."""
        self._loop = loop
        warm: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(warm,), name="llama-decode", daemon=True)
        self._thread.start()
        warm.result()  # a warm-up that raised ends the thread and is raised here

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- asyncio-side API -------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._cv:
            self._incoming.append(seq)
            self._cv.notify()

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True
        with self._cv:
            self._cv.notify()

    def embed(self, inputs: list[list[int]]) -> asyncio.Future[list[list[float]]]:
        """Queue token lists for pooled, normalized embeddings; returns a future of vectors."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[list[float]]] = loop.create_future()

        def done(result: list[list[float]] | BaseException) -> None:
            def set_() -> None:
                if fut.done():
                    return
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

            loop.call_soon_threadsafe(set_)

        with self._cv:
            self._embeds.add(inputs, done)
            self._cv.notify()
        return fut

    def snapshot(self) -> dict[str, int]:
        busy = sum(1 for s in self.slots if s.seq is not None)
        return {
            "slots_total": self.parallel,
            "slots_busy": busy,
            "waiting": len(self._incoming),
            "kv_cells_used": sum(len(s.tokens) for s in self.slots),
            **self.stats,
            "decode_ms_total": int(self.context.decode_s * 1000) if self.context is not None else 0,
            "step_ms_total": int(self._step_s * 1000),
            "decode_only_tokens_total": self._decode_only["tokens"],
            "decode_only_ms_total": int(self._decode_only["seconds"] * 1000),
            "decode_only_stream_ms_total": int(self._decode_only["stream_seconds"] * 1000),
            "even_outputs": int(self.context is not None and self.context.even_outputs),
            "even_outputs_odd_rows_us": self.parity_us[0],
            "even_outputs_even_rows_us": self.parity_us[1],
            "even_outputs_padded_steps_total": self.context.padded_steps if self.context is not None else 0,
        }

    # -- decode thread ----------------------------------------------------------
    def _calibrate_parity(self) -> None:
        """Decide whether decodes pad their output rows to an even count (``--even-outputs``)."""
        context = self.context
        if self.even_outputs_mode == "off":
            return
        result = calibrate(context)
        if result is not None:
            self.parity_us = (int(result.odd_s * 1e6), int(result.even_s * 1e6))
        context.even_outputs = self.even_outputs_mode == "on" or (result is not None and result.pays)

    def _sampled_ready(self, slot: Slot, fut: Future[int]) -> None:
        """A token sampled in the helper thread is back (runs in that thread)."""
        with self._cv:
            self._sampled.append((slot, fut))
            self._cv.notify()

    @staticmethod
    def _runnable(active: list[Slot]) -> bool:
        return any(s.job is None for s in active)

    def _run(self, warm: Future[None]) -> None:
        try:
            if self.context is not None:
                self.context.warm_up()  # here, not on the loading thread: see .context
                self._calibrate_parity()
        except BaseException as exc:
            warm.set_exception(exc)
            return
        warm.set_result(None)
        active: list[Slot] = []
        embeds = self._embeds
        while True:
            with self._cv:
                while (
                    not self._stopping and not self._runnable(active) and embeds.idle and not self._incoming and not self._sampled
                ):
                    self._cv.wait()
                if self._stopping:
                    break
                embeds.take()
                sampled = list(self._sampled)
                self._sampled.clear()
            events: list[Event] = []
            for slot, result in sampled:
                self._sampled_back(slot, result, events)
            self._admit(active)  # before embedding: a request that just arrived counts as waiting on it
            embeds.turn(self._runnable(active), bool(active))
            t0 = time.perf_counter()
            n = 0
            streams = sum(1 for s in active if s.job is None)
            generated = self.stats["tokens_generated_total"]
            try:
                n = self._step(active, events)
            except Exception as exc:  # a failed decode fails the running requests, not the worker
                self._fail_all(active, events, str(exc))
            active[:] = [s for s in active if s.seq is not None]
            if events:
                marks, self._marks = self._marks, []
                self._loop.call_soon_threadsafe(self._deliver, events, marks)
            dt = time.perf_counter() - t0
            self._step_s += dt
            if n == 0 and streams and self.stats["tokens_generated_total"] > generated:
                self._decode_only["tokens"] += self.stats["tokens_generated_total"] - generated
                self._decode_only["seconds"] += dt
                self._decode_only["stream_seconds"] += dt * streams
            self._pacer.observe(n, dt)
            embeds.decoded(dt)
        if self._sampler is not None:
            self._sampler.close()
        for slot in active:
            if slot.seq is not None:
                slot.seq.free_samplers()

    def _fail_all(self, active: list[Slot], events: list[Event], error: str) -> None:
        for slot in list(active):
            if slot.job is not None:
                slot.job.exception()  # let the helper thread finish with the chain before freeing it
                slot.job = None
            self._finish(slot, FINISH_ERROR, events, error=error)
            self.context.drop(slot.id)
            slot.tokens = []
        active.clear()
        with self._cv:
            self._sampled.clear()

    @staticmethod
    def _deliver(events: list[Event], marks: list[tuple[LogprobRecorder, int]]) -> None:
        for seq, text, finish in events:
            seq.push(text, finish)
        for recorder, n in marks:  # after the texts, in the same callback: a reader sees both together
            recorder.visible = n

    def _admit(self, active: list[Slot]) -> None:
        while True:
            free = [s for s in self.slots if s.seq is None]
            if not free:
                return
            with self._cv:
                if not self._incoming:
                    return
                seq = self._incoming.popleft()
            if seq.cancelled:
                seq.free_samplers()
                continue
            slot = self._prefix.place(seq, free)
            slot.seq = seq
            slot.feed = -1
            slot.drafts = []
            active.append(slot)
            self.stats["prompt_tokens_total"] += len(seq.prompt)
            self.stats["cached_tokens_total"] += seq.cached

    def _step(self, active: list[Slot], events: list[Event]) -> int:
        """One decode of every generating sequence's next token and paced prompt chunks.

        Returns the step's tokens when it read prompt tokens (such steps teach the
        pacer the rate), else 0.
        """
        context, sampler = self.context, self._sampler
        if not active or context is None or sampler is None:
            return 0
        tok, pos, sids, lg = context.tok, context.pos, context.sid, context.lg
        n = 0
        # Drafts only while few sequences generate (see .speculation).
        spec_ok = self.spec_ngram > 0 and sum(1 for s in active if s.feed >= 0) <= SPEC_MAX_SEQS
        # 1. cancellations, then one token (plus drafts) per generating sequence
        for slot in active:
            seq = slot.seq
            if seq is None or slot.job is not None:
                continue  # its token is being sampled in the helper thread
            if seq.cancelled:
                self._finish(slot, FINISH_CANCELLED, events)
                continue
            if slot.feed >= 0:
                p = len(slot.tokens)
                tok[n], pos[n], lg[n] = slot.feed, p, 1
                sids[n][0] = slot.id
                slot.out_idx = n
                n += 1
                if spec_ok and seq.spec:
                    slot.drafts = draft(slot, self.spec_ngram, self.spec_draft, self.n_ctx_slot)
                    for d in slot.drafts:
                        p += 1
                        tok[n], pos[n], lg[n] = d, p, 1
                        sids[n][0] = slot.id
                        n += 1
        # 2. prompt chunks within the remaining budget, shared max-min fairly
        budget = self.n_batch - n
        reading = [s for s in active if s.seq is not None and s.job is None and s.feed < 0]
        waiting = n or len(reading) > 1 or any(s.job is not None for s in active)
        with self._cv:
            waiting = waiting or bool(self._incoming)
        # others wait on this step: keep it short; alone, still short enough for a newcomer
        paced = self._pacer.tokens(BUSY_STEP_S if waiting else LONE_STEP_S, self.n_batch) - n
        budget = min(budget, max(paced, MIN_PREFILL_TOKENS))
        wants = [len(s.seq.prompt) - len(s.tokens) for s in reading]
        for i, s in enumerate(reading):
            if s.seq.scores_prompt:  # each row kept costs n_vocab floats of libllama's output buffer
                wants[i] = min(wants[i], PROMPT_ROWS_PER_STEP)
        shares = fair_shares(wants, budget) if budget > 0 else []
        scored: list[tuple[Slot, int, int, int]] = []  # (slot, first batch entry, first and end positions)
        read = sum(shares)
        for slot, share in zip(reading, shares, strict=False):  # no budget: no shares, nothing read
            if share <= 0:
                continue
            seq = slot.seq
            start = len(slot.tokens)
            end = start + share
            prompt, sid = seq.prompt, slot.id
            for i in range(start, end):
                tok[n], pos[n], lg[n] = prompt[i], i, 0
                sids[n][0] = sid
                n += 1
            slot.chunk_end = end
            if seq.scores_prompt:
                for j in range(n - share, n):
                    lg[j] = 1
                scored.append((slot, n - share, start, end))
            if end == len(prompt) and seq.max_new > 0:
                lg[n - 1] = 1
                slot.out_idx = n - 1
        if n == 0:
            return 0
        context.decode(n)
        # 3. commit KV bookkeeping and sample
        for slot in active:
            seq = slot.seq
            if seq is None or slot.job is not None:
                continue
            if slot.feed >= 0:
                slot.tokens.append(slot.feed)
                if slot.drafts:
                    self._verify(slot, context, sampler, events)
                    continue
            elif slot.chunk_end:
                slot.tokens.extend(seq.prompt[len(slot.tokens) : slot.chunk_end])
                slot.chunk_end = 0
            if slot.out_idx >= 0:
                t = sampler.sample(slot, slot.out_idx)
                slot.out_idx = -1
                if t >= 0:
                    self._accept(slot, t, events)
        if scored:
            self._score_prompts(scored, events)
        return n if read else 0

    def _score_prompts(self, scored: list[tuple[Slot, int, int, int]], events: list[Event]) -> None:
        """Record the log-probabilities of prompt tokens read this step (echo with logprobs).

        The logits at position p score the token at p + 1. A sequence asking for no
        new tokens (scoring a prompt) is done once its prompt is read.
        """
        ctx, n_vocab = self.context.ctx, self.model.info.n_vocab
        for slot, first, start, end in scored:
            seq = slot.seq
            if seq is None:
                continue
            prompt = seq.prompt
            rows = [(logits_row(ctx, first + p - start, n_vocab), prompt[p + 1]) for p in range(start, min(end, len(prompt) - 1))]
            seq.logprobs.add_prompt(prompt[0], rows)
            if end == len(prompt) and seq.max_new == 0:
                self._finish(slot, FINISH_LENGTH, events)

    def _verify(self, slot: Slot, context: DecodeContext, sampler: TokenSampler, events: list[Event]) -> None:
        """Check ``slot``'s drafts against the samples at their positions; drop the KV of rejected ones."""
        drafts, slot.drafts = slot.drafts, []
        idx, slot.out_idx = slot.out_idx, -1
        self.stats["spec_drafted_total"] += len(drafts)
        self.stats["spec_accepted_total"] += verify(slot, idx, drafts, sampler.sample, lambda s, t: self._accept(s, t, events))
        context.drop(slot.id, len(slot.tokens))  # positions past what the slot now holds

    def _sampled_back(self, slot: Slot, fut: Future[int], events: list[Event]) -> None:
        slot.job = None
        if slot.seq is None:
            return
        exc = fut.exception()
        if exc is not None:
            self._finish(slot, FINISH_ERROR, events, error=str(exc))
            return
        if slot.seq.cancelled:
            self._finish(slot, FINISH_CANCELLED, events)
            return
        self._accept(slot, fut.result(), events)

    def _accept(self, slot: Slot, t: int, events: list[Event]) -> bool:
        """Handle one sampled token; return True if the sequence continues."""
        seq = slot.seq
        if seq.ban_first:
            drop_first_link(seq.chain)
            seq.ban_first = False
        if seq.n_gen == 0:
            seq.t_first = time.perf_counter()
        seq.n_gen += 1
        self.stats["tokens_generated_total"] += 1
        model = self.model
        lp, marks = seq.logprobs, self._marks  # lp: only requests that asked for logprobs
        if model.is_eog(t):
            events.append((seq, seq.text.flush(), FINISH_STOP))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self._release(slot)
            return False
        if lp is not None:
            lp.commit()  # an output token (an end-of-generation token is not one)
        text, hit = seq.text.feed(model.piece(t))
        if hit:
            events.append((seq, text, FINISH_STOP))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self._release(slot)
            return False
        if seq.n_gen >= seq.max_new or len(slot.tokens) >= self.n_ctx_slot:
            events.append((seq, text + seq.text.flush(), FINISH_LENGTH))
            if lp is not None:
                marks.append((lp, lp.mark()))
            self._release(slot)
            return False
        if text:
            events.append((seq, text, None))
            if lp is not None:  # the entries this event's text covers
                marks.append((lp, lp.mark()))
        slot.feed = t
        return True

    # -- lifecycle of a slot ------------------------------------------------------
    def _release(self, slot: Slot) -> None:
        slot.seq.free_samplers()
        slot.seq = None
        slot.feed = -1
        slot.out_idx = -1
        slot.chunk_end = 0
        slot.last_used = time.monotonic()

    def _finish(self, slot: Slot, reason: str, events: list[Event], *, error: str | None = None) -> None:
        seq = slot.seq
        if seq is None:
            return
        seq.error = error
        events.append((seq, "", reason))
        self._release(slot)

    def close(self) -> None:
        self.stop()
        self._embeds.close()
        if self.context is not None:
            self.context.close()
