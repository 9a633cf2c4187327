"""The decode context: one ``llama_context`` whose unified KV cache holds every slot, and its batch.

Owned by the decode thread. The batch's arrays are exposed as attributes so the
step loop fills them without a call per token.

Every graph of the worker is computed by that one thread, the warm-up included
(:meth:`DecodeContext.warm_up`, called first thing on it). llama.cpp's CPU backend
runs a graph as an OpenMP parallel region, and libgomp keeps a team of threads for
each thread that ever started one. Once the teams hold more threads than the box
has CPUs, libgomp stops spinning at its barriers after about a hundred rounds and
sleeps instead; a decode passes a barrier at every node of its graph, so its
threads then sleep and wake hundreds of times per token. Measured on two cores
with two threads: a warm-up decode on the loading thread left both compute threads
idle 13-16% of the time and cost the worker 9-17% of its tokens per second.
"""

from __future__ import annotations

import time

import llama_cpp.llama_cpp as ll

from . import output_parity
from .errors import DecodeFailure
from .model import LoadedModel
from .params import KvSettings


class DecodeContext:
    """``parallel`` sequences of ``ctx_per_slot`` tokens each in one KV cache, decoded ``n_batch`` tokens at a time."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        ctx_per_slot: int,
        parallel: int,
        threads: int,
        n_batch: int,
        kv: KvSettings = KvSettings(),
        unified: bool = True,
    ) -> None:
        """``unified=False`` gives each sequence a KV stream of its own; only ``bench_decode_shapes.py`` asks for it."""
        p = ll.llama_context_default_params()
        kv.apply(p)
        p.n_ctx = ctx_per_slot * parallel
        p.n_batch = n_batch
        p.n_ubatch = n_batch
        p.n_seq_max = parallel + 1  # the slots, and the padding sequence
        p.n_threads = threads
        p.n_threads_batch = threads
        p.kv_unified = unified
        p.no_perf = True
        self.ctx = ll.llama_init_from_model(model.ptr, p)
        if not self.ctx:
            raise DecodeFailure(
                f"llama.cpp could not create the context with a {kv.kv_type} KV cache and flash attention "
                f"{kv.flash_attn} (out of memory, or a combination this build does not support)"
            )
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        b = self.batch
        self.tok, self.pos, self.lg = b.token, b.pos, b.logits
        self.sid = [b.seq_id[i] for i in range(n_batch)]
        for i in range(n_batch):
            b.n_seq_id[i] = 1
        self.decode_s = 0.0  # time inside llama_decode
        self.pad_token = model.info.bos if model.info.bos >= 0 else 0  # what the warm-up and padding decode
        self.n_batch = n_batch
        self.pad_sid = parallel  # the padding sequence: never a slot's
        self.even_outputs = False  # pad odd output counts (set from a calibration, see .output_parity)
        self.padded_steps = 0

    def warm_up(self) -> None:
        """One tiny decode so the first request does not pay for page-in; on the thread that will decode."""
        self.tok[0], self.pos[0], self.sid[0][0], self.lg[0] = self.pad_token, 0, 0, 1
        self.batch.n_tokens = 1
        ll.llama_decode(self.ctx, self.batch)
        ll.llama_memory_clear(self.mem, True)

    def decode(self, n_tokens: int) -> None:
        """Decode the first ``n_tokens`` entries of the batch (with even output rows, when that is faster)."""
        padded, changed = output_parity.even_up(self, n_tokens) if self.even_outputs else (n_tokens, False)
        self.batch.n_tokens = padded
        t0 = time.perf_counter()
        rc = ll.llama_decode(self.ctx, self.batch)
        if padded != n_tokens:
            ll.llama_memory_seq_rm(self.mem, self.pad_sid, -1, -1)
            if rc == 1:  # no KV cell left for the padding token: decode without it
                changed = False
                self.batch.n_tokens = n_tokens
                rc = ll.llama_decode(self.ctx, self.batch)
        self.padded_steps += changed
        self.decode_s += time.perf_counter() - t0
        if rc != 0:
            raise DecodeFailure(f"llama_decode failed ({rc}): the KV cache is full or the batch was rejected")

    def set_threads(self, n: int) -> None:
        """Compute with ``n`` threads from the next decode on (see :mod:`.contention`)."""
        ll.llama_set_n_threads(self.ctx, n, n)

    def drop(self, sid: int, start: int = -1) -> bool:
        """Forget ``sid``'s KV from position ``start`` on (all of it for -1); False if libllama cannot cut there."""
        return ll.llama_memory_seq_rm(self.mem, sid, start, -1)

    def copy(self, src: int, dst: int, n: int) -> None:
        """Share the KV cells of ``src``'s first ``n`` positions into ``dst``."""
        ll.llama_memory_seq_cp(self.mem, src, dst, 0, n)

    def first_position(self, sid: int) -> int:
        """The lowest position ``sid`` still holds (sliding-window layers drop old ones)."""
        return ll.llama_memory_seq_pos_min(self.mem, sid)

    def close(self) -> None:
        if self.ctx is not None:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
