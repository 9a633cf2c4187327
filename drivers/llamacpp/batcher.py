"""Continuous batching over one llama.cpp context.

One ``llama_context`` (:mod:`.context`) holds ``parallel`` sequences in a
unified KV cache. A dedicated thread runs the decode loop; each step is ONE
``llama_decode`` that carries the next token of every generating sequence
plus, within the batch budget, chunks of pending prompts (so long prefills
interleave with running streams). New requests join between steps, in the
slot :mod:`.scheduling` picks for them. Each step's results reach the asyncio
loop in ONE ``call_soon_threadsafe``.

Fairness: no request holds the decode thread for long.

- Prompt reading is planned by latency targets (:mod:`.step_planner`): beside
  the generating sequences a step reads as many prompt tokens as keeps every
  stream on its time-per-output-token target, by the learned cost of a step;
  the most urgent class first, then the prompts that can still meet their TTFT
  target (soonest due first), so a short chat is read in its first step beside a
  long document; a small request runs without other prompts read beside it.
- Grammar sampling that needs the whole vocabulary filtered runs in a helper
  thread (:mod:`.token_sampler`); the sequence skips steps until its token is
  back, the others keep decoding.
- A step nobody generates beside lasts a fraction of the TTFT target, so a
  request arriving meanwhile waits no longer than that for its first step.
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

from .contention import ComputeThreads, ContentionPolicy
from .context import DecodeContext
from .embed import EmbedQueue
from .latency import LatencyTargets
from .logprobs import LogprobRecorder
from .model import LoadedModel
from .output_parity import calibrate
from .params import KvSettings
from .scheduling import PrefixCache
from .sequence import FINISH_CANCELLED, FINISH_ERROR, Event, Sequence, Slot
from .slot_results import SlotResults
from .speculation import draft, may_draft
from .step_planner import MIN_PREFILL_TOKENS, Chunk, StepPlanner, small_running, write_chunks
from .token_sampler import TokenSampler


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
        contention: ContentionPolicy = ContentionPolicy(),
        targets: LatencyTargets | None = None,
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
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_s = 0.0  # time of whole steps (decode + Python scheduling and sampling)
        self.stats = {
            "tokens_generated_total": 0,
            "prompt_tokens_total": 0,
            "cached_tokens_total": 0,
            "spec_drafted_total": 0,
            "spec_accepted_total": 0,
        }
        self._results = SlotResults(model, ctx, self.stats)  # what sampled tokens do to their sequences
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
        # fewer compute threads while other work takes the cores; step sizes learned per thread count (.contention)
        self.compute = ComputeThreads(threads, [t for t in (self.context, self._embeds) if t is not None], contention)
        # how much prompt reading each step carries, and whose: from the latency targets (.step_planner)
        pacer = self.compute.pacer(MIN_PREFILL_TOKENS)
        self._planner = StepPlanner(targets or LatencyTargets(), self.n_batch, pacer=pacer, regime=lambda: self.compute.threads)

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

    def snapshot(self) -> dict[str, float]:
        busy = sum(1 for s in self.slots if s.seq is not None)
        return {
            "slots_total": self.parallel,
            "slots_busy": busy,
            "waiting": len(self._incoming),
            "kv_cells_used": sum(len(s.tokens) for s in self.slots),
            **self.stats,
            # prompt tokens whose KV a slot already held, of all prompt tokens asked
            "prefix_cache_hit_rate": round(self.stats["cached_tokens_total"] / max(1, self.stats["prompt_tokens_total"]), 4),
            "decode_ms_total": int(self.context.decode_s * 1000) if self.context is not None else 0,
            "step_ms_total": int(self._step_s * 1000),
            "decode_only_tokens_total": self._decode_only["tokens"],
            "decode_only_ms_total": int(self._decode_only["seconds"] * 1000),
            "decode_only_stream_ms_total": int(self._decode_only["stream_seconds"] * 1000),
            "even_outputs": int(self.context is not None and self.context.even_outputs),
            "even_outputs_odd_rows_us": self.parity_us[0],
            "even_outputs_even_rows_us": self.parity_us[1],
            "even_outputs_padded_steps_total": self.context.padded_steps if self.context is not None else 0,
            **self.compute.snapshot(),
        }

    # -- decode thread ----------------------------------------------------------
    def _calibrate_parity(self) -> None:
        """Decide whether decodes pad their output rows to an even count (``--even-outputs``)."""
        context = self.context
        assert context is not None  # made on the decode thread before it calibrates
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
                self._results.sampled_back(slot, result, events)
            self._admit(active)  # before embedding: a request that just arrived counts as waiting on it
            # a short answer runs: no embedding group beside it
            embedded = embeds.turn(self._runnable(active), bool(active), small_running(active))
            if embedded is not None:  # (tokens, seconds) of an embedding group: measured for the thread governor
                self.compute.sample(("embed",), embedded[0], embedded[1])  # groups are sized per count: any size compares
            t0 = time.perf_counter()
            rows = read = 0
            streams = sum(1 for s in active if s.job is None)
            generated = self.stats["tokens_generated_total"]
            try:
                rows, read = self._step(active, events)
            except Exception as exc:  # a failed decode fails the running requests, not the worker
                self._fail_all(active, events, str(exc))
            active[:] = [s for s in active if s.seq is not None]
            if events:
                assert self._loop is not None  # start() records the loop before the decode thread runs
                self._loop.call_soon_threadsafe(self._deliver, events, self._results.take_marks())
            dt = time.perf_counter() - t0
            self._step_s += dt
            if read == 0 and streams and self.stats["tokens_generated_total"] > generated:
                self._decode_only["tokens"] += self.stats["tokens_generated_total"] - generated
                self._decode_only["seconds"] += dt
                self._decode_only["stream_seconds"] += dt * streams
            self._planner.observe(rows, read, dt)
            embeds.decoded(dt)
            if rows + read:  # measured for the thread governor (.contention)
                base = self.compute.base_threads  # the count a running trial started from, else the current one
                expected = self._planner.expected_seconds(base, rows, read)
                if expected is not None:  # any shape compares with any other, through that count's cost model
                    self.compute.sample(("step",), expected, dt)
                else:  # until the model is ready: only with steps keeping as many rows, reading a prompt or not
                    self.compute.sample(("step", rows, read > 0), rows + read, dt)
            self.compute.tick()
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
            self._results.finish(slot, FINISH_ERROR, events, error=error)
            assert self.context is not None  # requests run only once the context is made
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
                rank = self._planner.targets.rank  # interactive before batch, first come first within a class
                seq = min(self._incoming, key=lambda s: (rank(s.priority), s.t_submit))
                self._incoming.remove(seq)
            if seq.cancelled:
                seq.free_samplers()
                continue
            assert self._prefix is not None  # made with the context, before any request is admitted
            slot = self._prefix.place(seq, free)
            planner = self._planner
            seq.small = planner.targets.rank(seq.priority) == 0 and planner.is_small(len(seq.prompt) - seq.cached, seq.max_new)
            slot.seq = seq
            slot.feed = -1
            slot.drafts = []
            active.append(slot)
            self.stats["prompt_tokens_total"] += len(seq.prompt)
            self.stats["cached_tokens_total"] += seq.cached

    def _step(self, active: list[Slot], events: list[Event]) -> tuple[int, int]:
        """One decode of every generating sequence's next token and planned prompt chunks.

        Returns the step's shape, (logits rows kept, prompt tokens read): the planner learns its cost from it.
        """
        context, sampler = self.context, self._sampler
        if not active or context is None or sampler is None:
            return 0, 0
        tok, pos, sids, lg = context.tok, context.pos, context.sid, context.lg
        n = 0
        planner, now = self._planner, time.perf_counter()
        # Drafts only while few sequences generate and no interactive prompt waits (see .speculation).
        spec_ok = self.spec_ngram > 0 and may_draft(
            sum(1 for s in active if s.feed >= 0), bool(planner.interactive_prompts(active))
        )
        room = planner.batch_room(active, now)  # batch work beside interactive work (.batch_yield); None: no limit
        held: set[int] = set()  # batch streams that sit this step out
        # 1. cancellations, then one token (plus drafts) per generating sequence
        for slot in active:
            seq = slot.seq
            if seq is None or slot.job is not None:
                continue  # its token is being sampled in the helper thread
            if seq.cancelled:
                self._results.finish(slot, FINISH_CANCELLED, events)
                continue
            if slot.feed >= 0 and room is not None and planner.targets.rank(seq.priority) > 0 and slot.id not in room.decoding:
                held.add(slot.id)
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
        # 2. prompt chunks: as many as the latency targets leave time for, most urgent first (.step_planner)
        reading = [s for s in active if s.seq is not None and s.job is None and s.feed < 0]
        read = 0
        scored: list[Chunk] = []
        if reading:
            batch_cap = room.prompt_tokens if room is not None else None
            small = planner.small_first(active, reading, now)  # a small request runs: only small prompts are read
            if small is not None:
                shares = planner.shares(small, self.n_batch - n, now, batch_cap)
            else:
                stepping = [s for s in active if s.id not in held]
                budget = planner.prompt_budget(planner.step_seconds(stepping, now), n + 1, self.n_batch - n)
                shares = planner.shares(reading, budget, now, batch_cap)
            end, scored = write_chunks(context, shares, n)
            read, n = end - n, end
        if n == 0:
            return 0, 0
        rows = sum(1 for i in range(n) if lg[i])
        context.decode(n)
        # 3. commit KV bookkeeping and sample
        for slot in active:
            seq = slot.seq
            if seq is None or slot.job is not None or slot.id in held:
                continue
            if slot.feed >= 0:
                slot.tokens.append(slot.feed)
                if slot.drafts:
                    self._results.verify(slot, context, sampler, events)
                    continue
            elif slot.chunk_end:
                slot.tokens.extend(seq.prompt[len(slot.tokens) : slot.chunk_end])
                slot.chunk_end = 0
            if slot.out_idx >= 0:
                t = sampler.sample(slot, slot.out_idx)
                slot.out_idx = -1
                if t >= 0:
                    self._results.accept(slot, t, events)
        if scored:
            self._results.score_prompts(context.ctx, scored, events)
        return rows, read

    def close(self) -> None:
        self.stop()
        self._embeds.close()
        if self.context is not None:
            self.context.close()
