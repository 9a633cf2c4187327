"""Continuous batching over one llama.cpp context.

One ``llama_context`` holds ``parallel`` sequences in a unified KV cache. A
dedicated thread runs the decode loop; each step is ONE ``llama_decode`` that
carries the next token of every generating sequence plus, within the batch
budget, chunks of pending prompts (so long prefills interleave with running
streams). New requests join between steps. Each step's results reach the
asyncio loop in ONE ``call_soon_threadsafe``.

Fairness: no request holds the decode thread for long.

- Prefill budget is shared max-min fairly among the prompts still being read
  (each step, the shortest remainders are served whole and the rest split
  what is left), so a short prompt joining beside a long one is read in its
  first step instead of after the long one.
- Grammar sampling that needs the whole vocabulary filtered (a free choice
  broke the grammar, or a chain with penalties holds the grammar) runs in a
  helper thread on a copy of the logits row: libllama's grammar check costs
  milliseconds to seconds per token with large grammars and releases the GIL.
  The sequence skips steps until its token is back; the others keep decoding.
- While any other sequence is generating or reading its prompt, prompts are
  read at most :data:`BUSY_PREFILL_TOKENS` per step (all of ``n_batch`` for a
  lone prompt), so a long prefill adds a bounded time to each of their tokens.
- Embedding requests are embedded a bounded group at a time between decode
  steps (see :mod:`.llamacpp_embed`); while generation runs, embedding gets
  at most as much of the thread's time as decoding does.

Prefix cache: a slot keeps the tokens of its last request in KV after it
finishes. A new prompt takes the free slot sharing the longest prefix with it
and only prefills the rest; if a busy slot shares a longer prefix, its cells
are shared into the new slot with ``llama_memory_seq_cp``.

Thread ownership: slots, the context, the batch and samplers belong to the
decode thread. The asyncio side only appends to the incoming queue (under
the condition's lock) and sets ``Sequence.cancelled``.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llama_cpp.llama_cpp as ll

from .embed import EMBED_STEP_TOKENS, EmbedJob, Embedder
from .model import LoadedModel
from .sampling import drop_first_link, free_chain
from .text import TextStream

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"
FINISH_ERROR = "error"
#: Speculative drafts are made only while at most this many sequences generate.
SPEC_MAX_SEQS = 2
#: Most prompt tokens read in a step while other sequences are generating: a step's
#: time is every generating sequence's time per token (32 tokens beside a 2k-token KV ≈ 0.1–0.3 s on two cores).
BUSY_PREFILL_TOKENS = 32


class EngineFailure(RuntimeError):
    """The context could not be created or a decode failed."""


class Sequence:
    """One generation request, shared between the decode thread and asyncio.

    The decode thread writes the counters and pushes (text, finish) events;
    the asyncio side reads them through :meth:`events`.
    """

    __slots__ = ("prompt", "max_new", "chain", "grammar", "chain_grammar", "ban_first", "text", "cancelled", "n_gen",
                 "cached", "finish", "error", "outbox", "waiter", "t_submit", "t_first", "spec")

    def __init__(self, prompt: list[int], max_new: int, chain, stops: list[str], *, ban_first: bool = False,
                 spec: bool = False, lstrip: bool = False) -> None:
        self.prompt = prompt
        self.max_new = max_new
        self.chain = chain
        self.grammar = None  # stand-alone grammar sampler (fast path), if any
        self.chain_grammar = False  # the chain itself holds a grammar (sampled in a helper thread)
        self.ban_first = ban_first
        self.text = TextStream(stops, lstrip=lstrip)
        self.cancelled = False
        self.n_gen = 0
        self.cached = 0
        self.finish: str | None = None
        self.error: str | None = None
        self.outbox: list[tuple[str, str | None]] = []
        self.waiter: asyncio.Future | None = None
        self.t_submit = time.perf_counter()
        self.t_first = 0.0
        self.spec = spec

    # -- asyncio side -------------------------------------------------------
    def _push(self, text: str, finish: str | None) -> None:
        if self.finish is not None:
            return  # already over (e.g. the client left and the engine confirms it)
        if finish is not None:
            self.finish = finish
        self.outbox.append((text, finish))
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def events(self):
        """Yield (text, finish_reason|None) until a finish reason arrives.

        Events that piled up while the consumer was busy are merged into one.
        """
        loop = asyncio.get_running_loop()
        while True:
            if not self.outbox:
                self.waiter = loop.create_future()
                await self.waiter
                self.waiter = None
            items, self.outbox = self.outbox, []
            if len(items) == 1:
                yield items[0]
                if items[0][1] is not None:
                    return
            else:
                finish = items[-1][1]
                yield "".join(t for t, _ in items), finish
                if finish is not None:
                    return


class Slot:
    __slots__ = ("id", "tokens", "seq", "feed", "out_idx", "chunk_end", "last_used", "drafts", "job")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.tokens: list[int] = []  # exactly the tokens whose KV this seq_id holds, positions 0..n-1
        self.seq: Sequence | None = None
        self.feed = -1  # sampled token to decode next step (-1: none / prefilling)
        self.out_idx = -1
        self.chunk_end = 0
        self.last_used = 0.0
        self.drafts: list[int] = []
        self.job: Future | None = None  # a token being sampled in a helper thread


def fair_shares(wants: list[int], budget: int) -> list[int]:
    """Max-min fair split of ``budget`` tokens among requests wanting ``wants`` tokens.

    Smaller wants are served whole; the rest share what remains equally (the
    first ones get the remainder of the division). Never more than wanted.
    """
    shares = [0] * len(wants)
    order = sorted(range(len(wants)), key=lambda i: wants[i])
    left = len(wants)
    for i in order:
        fair = budget // left if left else 0
        if budget % left:
            fair += 1
        give = min(wants[i], fair, budget)
        shares[i] = give
        budget -= give
        left -= 1
    return shares


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Batcher:
    def __init__(self, model: LoadedModel, *, ctx: int, parallel: int, threads: int, batch_size: int = 256,
                 spec_ngram: int = 0, spec_draft: int = 8, embedding_only: bool = False) -> None:
        self.model = model
        self.n_ctx_slot = ctx
        self.parallel = parallel
        self.threads = threads
        self.n_batch = max(batch_size, parallel * (1 + (spec_draft if spec_ngram else 0)))
        self.spec_ngram = spec_ngram
        self.spec_draft = spec_draft
        self.embedding_only = embedding_only
        self.ctx = None
        self.mem = None
        self.slots = [Slot(i) for i in range(parallel)]
        self._incoming: collections.deque[Sequence] = collections.deque()
        self._embed_jobs: collections.deque[tuple[list[list[int]], Callable[[Any], None]]] = collections.deque()
        self._embedding: tuple[EmbedJob, Callable[[Any], None]] | None = None  # the job being embedded
        self._sampled: collections.deque[tuple[Slot, Any]] = collections.deque()  # helper-thread results
        self._sampler_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-grammar")
        self._embed_debt = 0.0  # seconds embedding ran ahead of decoding (time share while both run)
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._embedder: Embedder | None = None
        self._decode_s = 0.0  # time inside llama_decode
        self._step_s = 0.0  # time of whole steps (decode + Python scheduling and sampling)
        self._one_data = (ll.llama_token_data * 1)()
        self._one = self._one_data[0]
        self._one_arr = ll.llama_token_data_array(self._one_data, 1, -1, False)
        self._one_ref = ctypes.byref(self._one_arr)
        self._full = None
        self.stats = {"tokens_generated_total": 0, "prompt_tokens_total": 0, "cached_tokens_total": 0,
                      "spec_drafted_total": 0, "spec_accepted_total": 0}
        if not embedding_only:
            self._init_context()

    # -- setup ----------------------------------------------------------------
    def _init_context(self) -> None:
        p = ll.llama_context_default_params()
        p.n_ctx = self.n_ctx_slot * self.parallel
        p.n_batch = self.n_batch
        p.n_ubatch = self.n_batch
        p.n_seq_max = self.parallel
        p.n_threads = self.threads
        p.n_threads_batch = self.threads
        p.kv_unified = True
        p.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model.ptr, p)
        if not self.ctx:
            raise EngineFailure("llama.cpp could not create the context (out of memory?)")
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(self.n_batch, 0, 1)
        b = self.batch
        self._b_tok, self._b_pos, self._b_lg = b.token, b.pos, b.logits
        self._b_sid = [b.seq_id[i] for i in range(self.n_batch)]
        for i in range(self.n_batch):
            b.n_seq_id[i] = 1
        self._warmup()

    def _warmup(self) -> None:
        """One tiny decode so the first request does not pay for page-in."""
        tok = self.model.info.bos if self.model.info.bos >= 0 else 0
        self._b_tok[0], self._b_pos[0], self._b_sid[0][0], self._b_lg[0] = tok, 0, 0, 1
        self.batch.n_tokens = 1
        ll.llama_decode(self.ctx, self.batch)
        ll.llama_memory_clear(self.mem, True)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="llama-decode", daemon=True)
        self._thread.start()

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

    def embed(self, inputs: list[list[int]]) -> asyncio.Future:
        """Queue token lists for pooled, normalized embeddings; returns a future of vectors."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(result: Any) -> None:
            def set_() -> None:
                if fut.done():
                    return
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
            loop.call_soon_threadsafe(set_)

        with self._cv:
            self._embed_jobs.append((inputs, done))
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
            "decode_ms_total": int(self._decode_s * 1000),
            "step_ms_total": int(self._step_s * 1000),
        }

    # -- decode thread ----------------------------------------------------------
    def _runnable(self, active: list[Slot]) -> bool:
        return any(s.job is None for s in active)

    def _run(self) -> None:
        active: list[Slot] = []
        while True:
            with self._cv:
                while (not self._stopping and not self._runnable(active) and not self._embed_jobs
                       and self._embedding is None and not self._incoming and not self._sampled):
                    self._cv.wait()
                if self._stopping:
                    break
                if self._embedding is None and self._embed_jobs:
                    inputs, done = self._embed_jobs.popleft()
                    self._embedding = (EmbedJob(inputs), done)
                sampled = list(self._sampled)
                self._sampled.clear()
            if self._embedding is not None:
                if not self._runnable(active) or self._embed_debt <= 0.0:
                    t_e = time.perf_counter()
                    self._embed_step()
                    self._embed_debt = self._embed_debt + time.perf_counter() - t_e if active else 0.0
            else:
                self._embed_debt = 0.0
            events: list[tuple[Sequence, str, str | None]] = []
            for slot, result in sampled:
                self._sampled_back(slot, result, events)
            self._admit(active)
            t0 = time.perf_counter()
            try:
                self._step(active, events)
            except Exception as exc:  # a failed decode fails the running requests, not the worker
                for slot in list(active):
                    if slot.job is not None:
                        slot.job.exception()  # let the helper thread finish with the chain before freeing it
                        slot.job = None
                    self._finish(slot, FINISH_ERROR, events, error=str(exc))
                    ll.llama_memory_seq_rm(self.mem, slot.id, -1, -1)
                    slot.tokens = []
                active.clear()
                with self._cv:
                    self._sampled.clear()
            active[:] = [s for s in active if s.seq is not None]
            if events:
                self._loop.call_soon_threadsafe(self._deliver, events)
            dt = time.perf_counter() - t0
            self._step_s += dt
            self._embed_debt = max(0.0, self._embed_debt - dt)
        self._sampler_pool.shutdown(wait=True)
        for slot in active:
            if slot.seq is not None:
                free_chain(slot.seq.chain)
                free_chain(slot.seq.grammar)

    @staticmethod
    def _deliver(events: list[tuple[Sequence, str, str | None]]) -> None:
        for seq, text, finish in events:
            seq._push(text, finish)

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
                free_chain(seq.chain)
                free_chain(seq.grammar)
                seq.chain = seq.grammar = None
                continue
            slot = self._place(seq, free)
            slot.seq = seq
            slot.feed = -1
            slot.drafts = []
            active.append(slot)
            self.stats["prompt_tokens_total"] += len(seq.prompt)
            self.stats["cached_tokens_total"] += seq.cached

    def _place(self, seq: Sequence, free: list[Slot]) -> Slot:
        """Pick the free slot with the longest cached prefix; reuse or share KV."""
        prompt = seq.prompt
        limit = len(prompt) - 1  # the last prompt token is always decoded (its logits are needed)
        best, best_len = None, -1
        for s in free:
            n = min(common_prefix(s.tokens, prompt), limit)
            if n > best_len or (n == best_len and s.last_used < best.last_used):
                best, best_len = s, n
        donor, donor_len = None, best_len
        for s in self.slots:
            if s is not best and s.tokens:
                n = min(common_prefix(s.tokens, prompt), limit)
                if n > donor_len:
                    donor, donor_len = s, n
        mem, sid = self.mem, best.id
        if donor is not None:
            ll.llama_memory_seq_rm(mem, sid, -1, -1)
            ll.llama_memory_seq_cp(mem, donor.id, sid, 0, donor_len)
            best.tokens = donor.tokens[:donor_len]
            n = donor_len
        else:
            n = best_len
            if not ll.llama_memory_seq_rm(mem, sid, n, -1):
                ll.llama_memory_seq_rm(mem, sid, -1, -1)
                n = 0
            del best.tokens[n:]
        n_swa = self.model.info.n_swa
        if n > 0 and n_swa > 0:
            # Sliding-window layers may have dropped cells the reused prefix still needs.
            pos_min = ll.llama_memory_seq_pos_min(mem, sid)
            if pos_min > max(0, n - n_swa):
                ll.llama_memory_seq_rm(mem, sid, -1, -1)
                best.tokens = []
                n = 0
        seq.cached = n
        return best

    def _step(self, active: list[Slot], events: list) -> None:
        tok, pos, sids, lg = self._b_tok, self._b_pos, self._b_sid, self._b_lg
        n = 0
        # Drafts only pay off while the step is memory-bound: with many sequences
        # generating, the CPU is already compute-bound and verification costs more
        # than it saves.
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
                    slot.drafts = self._draft(slot)
                    for d in slot.drafts:
                        p += 1
                        tok[n], pos[n], lg[n] = d, p, 1
                        sids[n][0] = slot.id
                        n += 1
        # 2. prompt chunks within the remaining budget, shared max-min fairly
        budget = self.n_batch - n
        reading = [s for s in active if s.seq is not None and s.job is None and s.feed < 0]
        if n or len(reading) > 1:  # others wait on this step: keep it short
            budget = min(budget, BUSY_PREFILL_TOKENS)
        shares = fair_shares([len(s.seq.prompt) - len(s.tokens) for s in reading], budget) if budget > 0 else []
        for slot, share in zip(reading, shares):
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
            if end == len(prompt):
                lg[n - 1] = 1
                slot.out_idx = n - 1
        if n == 0:
            return
        self.batch.n_tokens = n
        t0 = time.perf_counter()
        rc = ll.llama_decode(self.ctx, self.batch)
        self._decode_s += time.perf_counter() - t0
        if rc != 0:
            raise EngineFailure(f"llama_decode failed ({rc}): the KV cache is full or the batch was rejected")
        # 3. commit KV bookkeeping and sample
        ctx = self.ctx
        for slot in active:
            seq = slot.seq
            if seq is None or slot.job is not None:
                continue
            if slot.feed >= 0:
                slot.tokens.append(slot.feed)
                if slot.drafts:
                    self._verify(slot, events)
                    continue
            elif slot.chunk_end:
                slot.tokens.extend(seq.prompt[len(slot.tokens):slot.chunk_end])
                slot.chunk_end = 0
            if slot.out_idx >= 0:
                t = self._sample(slot, slot.out_idx)
                slot.out_idx = -1
                if t >= 0:
                    self._accept(slot, t, events)

    def _sample(self, slot: Slot, idx: int) -> int:
        """The sampled token, or -1 when it is being sampled in the helper thread."""
        seq = slot.seq
        if seq.chain_grammar:
            self._defer(slot, idx, None)
            return -1
        t = ll.llama_sampler_sample(seq.chain, self.ctx, idx)
        g = seq.grammar
        if g is None:
            return t
        one = self._one
        one.id, one.logit, one.p = t, 0.0, 0.0
        arr = self._one_arr
        arr.size, arr.selected, arr.sorted = 1, -1, False
        ll.llama_sampler_apply(g, self._one_ref)
        if one.logit != -math.inf:
            ll.llama_sampler_accept(g, t)
            return t
        # the free choice breaks the grammar: filter the whole vocabulary, then sample
        self._defer(slot, idx, g)
        return -1

    def _defer(self, slot: Slot, idx: int, grammar) -> None:
        """Sample ``slot``'s token from a copy of logits row ``idx`` in the helper thread.

        With ``grammar`` (stand-alone), the grammar filters the vocabulary, the
        chain picks, and the grammar accepts the pick; without, the chain holds
        the grammar and does all three. The slot takes no part in steps until
        the token is back (:meth:`_sampled_back`).
        """
        import numpy as np

        n_vocab = self.model.info.n_vocab
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, idx), shape=(n_vocab,)).copy()
        chain = slot.seq.chain

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
                raise EngineFailure("the grammar allows no token here")
            t = int(data[arr.selected].id)
            ll.llama_sampler_accept(grammar if grammar is not None else chain, t)
            return t

        fut = self._sampler_pool.submit(work)
        slot.job = fut

        def back(f: Future) -> None:
            with self._cv:
                self._sampled.append((slot, f))
                self._cv.notify()

        fut.add_done_callback(back)

    def _sampled_back(self, slot: Slot, fut: Future, events: list) -> None:
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

    def _accept(self, slot: Slot, t: int, events: list) -> bool:
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
        if model.is_eog(t):
            events.append((seq, seq.text.flush(), FINISH_STOP))
            self._release(slot)
            return False
        text, hit = seq.text.feed(model.piece(t))
        if hit:
            events.append((seq, text, FINISH_STOP))
            self._release(slot)
            return False
        if seq.n_gen >= seq.max_new or len(slot.tokens) >= self.n_ctx_slot:
            events.append((seq, text + seq.text.flush(), FINISH_LENGTH))
            self._release(slot)
            return False
        if text:
            events.append((seq, text, None))
        slot.feed = t
        return True

    # -- speculative decoding (prompt lookup) ---------------------------------------
    def _draft(self, slot: Slot) -> list[int]:
        """Propose tokens by finding the latest n-gram earlier in this sequence's history."""
        seq = slot.seq
        hist = slot.tokens + [slot.feed]
        g = self.spec_ngram
        if len(hist) <= g:
            return []
        room = min(self.spec_draft, seq.max_new - seq.n_gen - 1, self.n_ctx_slot - len(hist) - 1)
        if room <= 0:
            return []
        key = hist[-g:]
        first = key[0]
        # scan backwards for the most recent earlier occurrence
        for i in range(len(hist) - g - 1, -1, -1):
            if hist[i] == first and hist[i:i + g] == key:
                return hist[i + g:i + g + room]
        return []

    def _verify(self, slot: Slot, events: list) -> None:
        """Sample at the fed token and each draft; keep drafts while they match."""
        seq = slot.seq
        drafts = slot.drafts
        slot.drafts = []
        idx = slot.out_idx
        slot.out_idx = -1
        self.stats["spec_drafted_total"] += len(drafts)
        for j in range(len(drafts) + 1):
            t = self._sample(slot, idx + j)
            if not self._accept(slot, t, events):
                break
            if j < len(drafts) and t == drafts[j]:
                slot.tokens.append(t)  # the draft's KV is right: it was decoded after correct tokens
                self.stats["spec_accepted_total"] += 1
                continue
            break
        # drop KV of rejected drafts (positions past what the slot now holds)
        ll.llama_memory_seq_rm(self.mem, slot.id, len(slot.tokens), -1)

    # -- lifecycle of a slot ------------------------------------------------------
    def _release(self, slot: Slot) -> None:
        seq = slot.seq
        free_chain(seq.chain)
        free_chain(seq.grammar)
        seq.chain = seq.grammar = None
        slot.seq = None
        slot.feed = -1
        slot.out_idx = -1
        slot.chunk_end = 0
        slot.last_used = time.monotonic()

    def _finish(self, slot: Slot, reason: str, events: list, *, error: str | None = None) -> None:
        seq = slot.seq
        if seq is None:
            return
        seq.error = error
        events.append((seq, "", reason))
        self._release(slot)

    # -- embeddings (run on the decode thread, one bounded group between steps) -----
    def _embed_step(self) -> None:
        job, done = self._embedding
        try:
            if self._embedder is None:
                self._embedder = Embedder(self.model, ctx=max(512, self.n_ctx_slot), n_seq=min(self.parallel, 16),
                                          threads=self.threads)
            if self._embedder.step(job, EMBED_STEP_TOKENS):
                self._embedding = None
                done(job.out)
        except BaseException as exc:  # handed to the waiting request
            self._embedding = None
            done(exc)

    def close(self) -> None:
        self.stop()
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self.ctx is not None:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None


__all__ = ["Batcher", "Sequence", "EngineFailure", "common_prefix"]
