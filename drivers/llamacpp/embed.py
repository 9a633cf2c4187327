"""Pooled, L2-normalized embeddings on a second llama.cpp context.

The context is created on first use with ``embeddings=True``; pooling comes
from the model's metadata (``llama_pooling_type``), and models that declare
none (decoder LMs) are mean-pooled. Inputs are packed several sequences per
``llama_decode``. Runs on the batcher's decode thread: one group between two
decode steps, sized from the embedding rate learned at the current compute
thread count (:class:`.contention.ThreadPacer`) to last about
:data:`.scheduling.BUSY_STEP_S` (or one longer input alone, since a pooled
sequence must fit one decode), so a request with hundreds of inputs does not
stop generation while it is embedded, a chat arriving meanwhile waits at most
about that long, and a group stays that short when the worker gives up a
thread to a busy box. While sequences generate, embedding gets at most as much
of the thread's time as decoding, and decoding goes first when it begins.
While a small request runs (a short answer the step planner expects to finish
within :data:`.step_planner.SMALL_JOB_S`), no group starts: the answer takes
about its own time beside a corpus being embedded, and holds the corpus back
by no more than :data:`SMALL_HOLD_S` in a row.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import TypeAlias

import llama_cpp.llama_cpp as ll

from .contention import ThreadPacer
from .errors import EmbeddingError
from .model import LoadedModel
from .scheduling import BUSY_STEP_S

#: Seconds of decoding that go before the next group when generation begins beside an embedding request: a short
#: answer (a few tokens, even on one thread beside a busy process) is done before embedding takes the thread again.
FIRST_DECODE_S = 2 * BUSY_STEP_S
#: Most seconds of decoding that small requests may hold the next group back in a row (then one group goes):
#: a steady trickle of short answers slows an embedding request down, it cannot stop it.
SMALL_HOLD_S = 3 * FIRST_DECODE_S
#: Fewest tokens a group may hold (an input longer than the group's limit goes alone).
MIN_EMBED_TOKENS = 16
#: Receives a request's vectors, or the exception that ended it (called on the decode thread).
EmbedDone: TypeAlias = Callable[[list[list[float]] | BaseException], None]


class EmbedJob:
    """One request's inputs and the vectors embedded so far."""

    __slots__ = ("inputs", "next", "out")

    def __init__(self, inputs: list[list[int]]) -> None:
        self.inputs = inputs
        self.next = 0
        self.out: list[list[float]] = []


class Embedder:
    """The embedding context: packs inputs several sequences per decode and pools each."""

    def __init__(self, model: LoadedModel, *, ctx: int, n_seq: int, threads: int) -> None:
        self.model = model
        self.size = ctx
        ectx = None
        for pooling in (ll.LLAMA_POOLING_TYPE_UNSPECIFIED, ll.LLAMA_POOLING_TYPE_MEAN):
            p = ll.llama_context_default_params()
            p.n_ctx = ctx
            p.n_batch = p.n_ubatch = ctx  # a pooled sequence must fit one ubatch
            p.n_seq_max = n_seq
            p.n_threads = p.n_threads_batch = threads
            p.embeddings = True
            p.pooling_type = pooling
            p.kv_unified = True
            p.no_perf = True
            ectx = ll.llama_init_from_model(model.ptr, p)
            if not ectx:
                raise EmbeddingError("llama.cpp could not create the embedding context")
            if ll.llama_pooling_type(ectx) != ll.LLAMA_POOLING_TYPE_NONE:
                break
            ll.llama_free(ectx)  # the model says "no pooling": mean-pool instead
        self.ctx = ectx
        self.batch = ll.llama_batch_init(ctx, 0, 1)
        self.n_embd = ll.llama_model_n_embd_out(model.ptr)

    def set_threads(self, n: int) -> None:
        """Compute with ``n`` threads from the next group on (see :mod:`.contention`)."""
        ll.llama_set_n_threads(self.ctx, n, n)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """All of ``inputs`` at once (groups as large as the context allows)."""
        job = EmbedJob(inputs)
        while not self.step(job, self.size):
            pass
        return job.out

    def step(self, job: EmbedJob, max_tokens: int) -> bool:
        """Embed the next group of ``job`` (at most ``max_tokens`` tokens, or one input); True when done."""
        inputs = job.inputs
        if job.next == 0:
            longest = max(len(t) for t in inputs)
            if longest > self.size:
                raise EmbeddingError(f"input of {longest} tokens exceeds the embedding context ({self.size})")
        ectx, b, n_embd = self.ctx, self.batch, self.n_embd
        n_seq_max = ll.llama_n_seq_max(ectx)
        mem = ll.llama_get_memory(ectx)
        out = job.out
        i = job.next
        if i < len(inputs):
            limit = min(self.size, max(max_tokens, len(inputs[i])))
            group: list[list[int]] = []
            total = 0
            while i < len(inputs) and len(group) < n_seq_max and total + len(inputs[i]) <= limit:
                group.append(inputs[i])
                total += len(inputs[i])
                i += 1
            job.next = i
            n = 0
            for sid, toks in enumerate(group):
                for p, t in enumerate(toks):
                    b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = t, p, 1, 1
                    b.seq_id[n][0] = sid
                    n += 1
            b.n_tokens = n
            ll.llama_memory_clear(mem, True)
            if ll.llama_decode(ectx, b) != 0:
                raise EmbeddingError("llama_decode failed while embedding")
            for sid in range(len(group)):
                ptr = ll.llama_get_embeddings_seq(ectx, sid)
                if not ptr:
                    raise EmbeddingError("the model produced no pooled embedding")
                vec = ptr[:n_embd]
                norm = math.sqrt(sum(x * x for x in vec)) or 1.0
                out.append([x / norm for x in vec])
        return job.next >= len(inputs)

    def close(self) -> None:
        if self.ctx is not None:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None


class EmbedQueue:
    """Embedding requests waiting for the decode thread, embedded one bounded group per turn.

    The batcher appends under its lock (:meth:`add`) and the decode thread does the
    rest. While generation runs, embedding gets at most as much of the thread's time
    as decoding does: :attr:`debt` is how far embedding ran ahead.
    """

    def __init__(self, model: LoadedModel, *, ctx: int, n_seq: int, threads: int) -> None:
        self._model = model
        self._ctx, self._n_seq, self._threads = ctx, n_seq, threads
        self._waiting: collections.deque[tuple[list[list[int]], EmbedDone]] = collections.deque()
        self._current: tuple[EmbedJob, EmbedDone] | None = None
        self._embedder: Embedder | None = None  # created on first use
        self._pacer = ThreadPacer(MIN_EMBED_TOKENS, lambda: self._threads)  # a rate per thread count
        self.debt = 0.0
        self._generating = False  # whether any slot was busy at the last turn
        self._held: float | None = None  # seconds of decoding small requests held the next group back; None: not held

    @property
    def idle(self) -> bool:
        return self._current is None and not self._waiting

    def set_threads(self, n: int) -> None:
        """The worker's compute threads changed (decode thread only): the embedding context follows."""
        self._threads = n
        if self._embedder is not None:
            self._embedder.set_threads(n)

    def add(self, inputs: list[list[int]], done: EmbedDone) -> None:
        """Queue a request (the caller holds the batcher's lock)."""
        self._waiting.append((inputs, done))

    def take(self) -> None:
        """Start the next waiting request unless one is being embedded (the caller holds the lock)."""
        if self._current is None and self._waiting:
            inputs, done = self._waiting.popleft()
            self._current = (EmbedJob(inputs), done)

    def turn(self, decoding: bool, generating: bool, small: bool = False) -> tuple[int, float] | None:
        """Embed the next group, unless sequences are ``decoding`` and embedding ran ahead of them or ``small`` runs.

        Embedding time counts against decoding only while ``generating`` (any slot is busy);
        ``small``: a small request is among them (held back at most SMALL_HOLD_S in a row).
        Returns (tokens embedded, seconds) when a group ran.
        """
        started, self._generating = generating and not self._generating, generating
        if self._current is None:
            self.debt, self._held = 0.0, None
            return None
        if started:  # generation just began: its first steps go before the next group, so a short answer is not held
            self.debt = max(self.debt, FIRST_DECODE_S)
        if decoding and small and (self._held or 0.0) < SMALL_HOLD_S:
            self._held = self._held or 0.0
            return None
        self._held = None
        if decoding and self.debt > 0.0:
            return None
        t_e = time.perf_counter()
        tokens = self._step(self._pacer.tokens(BUSY_STEP_S, self._ctx))
        dt = time.perf_counter() - t_e
        self._pacer.observe(tokens, dt)
        self.debt = self.debt + dt if generating else 0.0
        return (tokens, dt) if tokens else None

    def decoded(self, seconds: float) -> None:
        """A decode step took ``seconds``: embedding may catch up by as much."""
        if self._held is not None:
            self._held += seconds
        self.debt = max(0.0, self.debt - seconds)

    def _step(self, max_tokens: int) -> int:
        """Embed the current request's next group of at most ``max_tokens``; returns the tokens embedded."""
        assert self._current is not None  # turn() steps only a current request
        job, done = self._current
        first = job.next
        try:
            if self._embedder is None:
                self._embedder = Embedder(self._model, ctx=self._ctx, n_seq=self._n_seq, threads=self._threads)
            if self._embedder.step(job, max_tokens):
                self._current = None
                done(job.out)
        except BaseException as exc:  # handed to the waiting request
            self._current = None
            done(exc)
            return 0
        return sum(len(t) for t in job.inputs[first : job.next])

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
