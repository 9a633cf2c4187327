"""What batch work may add to a step while interactive work runs: batch yields inside the step, not only at admission.

On a small model with a large vocabulary every logits row a step keeps costs the same
(Gemma 3 270M on two cores: about 5 ms), so each batch stream decoding beside
interactive ones makes every interactive token slower, and a batch prompt read in
the same step does too. While any interactive sequence is generating or waiting for
its first token:

- a batch stream decodes in a step only if the learned step cost
  (:class:`.step_cost.StepCostModel`) with its row stays within
  :data:`BATCH_INTERFERENCE` of the interactive work's own cost and within every
  interactive stream's TPOT deadline; the streams furthest behind their own
  schedule go first;
- a batch stream whose own TPOT target (``batch``'s, 0.5 s by default) would be
  broken decodes whatever it costs: batch work slows down, it never starves;
- batch prompts are read only in the time the rows left of that share (at least
  :data:`.step_planner.MIN_PREFILL_TOKENS` once one has waited half its TTFT target).

With no interactive sequence there is no limit: batch work uses the whole box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .latency import PRIORITIES, LatencyTargets
from .sequence import Slot
from .step_cost import StepCostModel

#: Most a step carrying interactive work may be lengthened by batch work, as a share of the interactive work's cost.
BATCH_INTERFERENCE = 0.15
#: Share of its TPOT target after which a batch stream's next token is due whatever it costs interactive streams.
BATCH_DUE_SAFETY = 0.9
#: Share of its TTFT target a batch prompt may wait before it is read beside interactive work anyway.
BATCH_PROMPT_PATIENCE = 0.5
#: The interactive class (the most urgent one).
INTERACTIVE = PRIORITIES[0]


@dataclass(frozen=True)
class BatchRoom:
    """The batch work one step may carry beside interactive work."""

    decoding: frozenset[int]  # ids of the batch streams' slots that decode this step
    prompt_tokens: int  # batch prompt tokens this step may read


def _is_interactive(targets: LatencyTargets, slot: Slot) -> bool:
    return slot.seq is not None and targets.rank(slot.seq.priority) == 0


def batch_room(active: list[Slot], now: float, targets: LatencyTargets, cost: StepCostModel, floor: int) -> BatchRoom | None:
    """The batch streams that decode and the batch prompt tokens read in this step; None when nothing limits batch work.

    ``active`` are the busy slots; a slot whose ``feed`` is set generates this step,
    one without reads its prompt (``job`` set: its token is being sampled elsewhere).
    ``floor`` is the fewest prompt tokens a long-waiting batch prompt is given.
    """
    interactive = [s for s in active if _is_interactive(targets, s) and s.job is None]  # a step can carry them
    if not interactive or all(_is_interactive(targets, s) for s in active if s.seq is not None):
        return None  # nothing to limit (with no batch work the step does not even ask the cost model)
    generating = [s for s in interactive if s.feed >= 0]
    batch_streams = [s for s in active if not _is_interactive(targets, s) and s.job is None and s.feed >= 0]
    batch_tpot = targets.of("batch").tpot_s

    def lateness(slot: Slot) -> float:  # seconds past the time its next token is due (negative: ahead)
        seq = slot.serving
        return now - (seq.t_first + BATCH_DUE_SAFETY * batch_tpot * seq.n_gen)

    batch_streams.sort(key=lateness, reverse=True)
    due = [s for s in batch_streams if lateness(s) >= 0]
    optional = [s for s in batch_streams if lateness(s) < 0]
    rows = len(generating)
    chosen = list(due)
    prompt_tokens = 0
    if cost.ready:
        a, b, c = cost.coef
        own = cost.predict(max(1, rows), 0)
        allowance = BATCH_INTERFERENCE * own - b * len(due)
        deadline = _interactive_deadline(generating, now, targets)
        if deadline is not None:  # no interactive stream's next token may come later than its target
            allowance = min(allowance, deadline - cost.predict(rows + len(due), 0))
        extra = len(optional) if b <= 0.0 else max(0, math.floor(allowance / b))
        chosen += optional[:extra]
        left = allowance - b * min(extra, len(optional))
        prompt_tokens = max(0, math.floor(left / c)) if c > 0.0 else 0
    waiting = [s for s in active if not _is_interactive(targets, s) and s.job is None and s.feed < 0 and s.seq is not None]
    patience = BATCH_PROMPT_PATIENCE * targets.of("batch").ttft_s
    if any(now - s.serving.t_submit >= patience for s in waiting):
        prompt_tokens = max(prompt_tokens, floor)
    return BatchRoom(frozenset(s.id for s in chosen), prompt_tokens)


def _interactive_deadline(generating: list[Slot], now: float, targets: LatencyTargets) -> float | None:
    """Seconds until the earliest interactive stream's next token is due (None: none generates yet)."""
    deadlines = [
        s.serving.t_first + targets.of(INTERACTIVE).tpot_s * s.serving.n_gen - now for s in generating if s.serving.n_gen > 0
    ]
    return min(deadlines) if deadlines else None
