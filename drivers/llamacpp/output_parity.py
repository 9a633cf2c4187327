"""Even output rows: a decode keeping an odd number (three or more) of logits rows is padded to even.

A decode step computes the output layer (hidden size × vocabulary) for every token
whose logits it keeps: one row per generating sequence, plus the last prompt token
of each prompt read to its end. llama.cpp's CPU matrix kernels work on pairs of
columns (tinyBLAS for ``Q8_0``/``Q4_0``/``Q5_0`` weights when built for AVX2's 16
vector registers; the two-row int8 kernels on ARM) and leave an odd column to a
slower pass of its own. Measured on the two-core test box with Gemma 3 270M (a
262k-token vocabulary, ``Q8_0`` output layer; ``tests/bench/bench_decode_shapes.py``):
3, 5, 7 generating sequences 43.2, 53.0, 63.1 ms a decode, 4, 6, 8 of them 35.1,
44.7, 54.0 ms; one sequence reading 8 tokens 62.2 ms keeping 7 rows, 51.5 ms keeping
8. One row (a lone stream) is not padded: two rows cost nearly twice one.

:func:`even_up` pads a batch before its decode: it keeps the logits of one prompt
token the step reads anyway (they are never looked at), or, in a step of generating
sequences only, adds one token of the padding sequence (:attr:`.context.DecodeContext.pad_sid`),
whose KV the context drops right after. Whether this box gains is measured once, on
the decode thread after the warm-up (:func:`calibrate`): GPU kernels and other CPUs
may not care, and then nothing is padded. The measurement takes each count's fastest
decode: it runs while the daemon and other engines start beside it, and another
process's work only ever slows a decode. (With medians of three rounds, two workers
started together on the two-core box decided differently, one measuring 8 rows at
1.25 s against 7 rows at 0.11 s, and served 3 and 5 streams 20-25% slower.)
"""

from __future__ import annotations

import time
from collections.abc import MutableSequence
from dataclasses import dataclass
from typing import Any, Protocol

import llama_cpp.llama_cpp as ll

#: The worker's ``--even-outputs`` choices: measure at load, always, never.
MODES = ("auto", "on", "off")
#: Fewest output rows worth padding (one row becomes two: nearly twice the work).
MIN_ROWS = 3
#: The row counts the calibration compares (the odd one, then the even one).
ODD_ROWS, EVEN_ROWS = 7, 8
#: Even rows must be at least this much faster than odd ones for ``auto`` to pad.
MARGIN = 0.98
#: The calibration stops after this many seconds once it has one measurement of each.
CALIBRATION_BUDGET_S = 2.0
CALIBRATION_ROUNDS = 5


class PaddableBatch(Protocol):
    """What padding and calibration use of a decode context (:class:`.context.DecodeContext` has it).

    Named here rather than imported, so the context may call :func:`even_up` without
    the two modules importing each other.
    """

    tok: MutableSequence[int]
    pos: MutableSequence[int]
    lg: MutableSequence[int]
    sid: list[Any]  # per batch entry, the entry's seq_id array (one id used)
    n_batch: int
    pad_token: int
    pad_sid: int
    ctx: Any  # llama_context_p
    mem: Any  # llama_memory_t
    batch: Any  # llama_batch


def even_up(context: PaddableBatch, n: int) -> tuple[int, bool]:
    """Make the kept rows of the batch's first ``n`` entries even; returns (entries to decode, whether padded)."""
    lg = context.lg
    rows, spare = 0, -1
    for i in range(n):
        if lg[i]:
            rows += 1
        else:
            spare = i
    if rows < MIN_ROWS or rows % 2 == 0:
        return n, False
    if spare >= 0:  # a prompt token the step reads anyway: keep its logits too
        lg[spare] = 1
        return n, True
    if n >= context.n_batch:
        return n, False
    context.tok[n], context.pos[n], context.lg[n] = context.pad_token, 0, 1
    context.sid[n][0] = context.pad_sid
    return n + 1, True


@dataclass(frozen=True)
class Calibration:
    """Fastest decode of :data:`ODD_ROWS` and of :data:`EVEN_ROWS` kept rows on this box."""

    odd_s: float
    even_s: float

    @property
    def pays(self) -> bool:
        return self.even_s < MARGIN * self.odd_s


def calibrate(context: PaddableBatch) -> Calibration | None:
    """Time decodes of the padding sequence keeping odd and even rows, alternating; None if the batch is too small.

    Runs on the decode thread before any slot is used. A large model on a small CPU
    takes seconds per decode, so the rounds stop at :data:`CALIBRATION_BUDGET_S`.
    """
    if context.n_batch < EVEN_ROWS:
        return None
    times: dict[int, list[float]] = {ODD_ROWS: [], EVEN_ROWS: []}
    start = time.perf_counter()
    for r in range(CALIBRATION_ROUNDS):
        for rows in (ODD_ROWS, EVEN_ROWS) if r % 2 == 0 else (EVEN_ROWS, ODD_ROWS):
            for i in range(rows):
                context.tok[i], context.pos[i], context.lg[i] = context.pad_token, i, 1
                context.sid[i][0] = context.pad_sid
            context.batch.n_tokens = rows
            t0 = time.perf_counter()
            rc = ll.llama_decode(context.ctx, context.batch)
            times[rows].append(time.perf_counter() - t0)
            ll.llama_memory_seq_rm(context.mem, context.pad_sid, -1, -1)
            if rc != 0:
                return None
        if time.perf_counter() - start > CALIBRATION_BUDGET_S:
            break
    return Calibration(min(times[ODD_ROWS]), min(times[EVEN_ROWS]))
