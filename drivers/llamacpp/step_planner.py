"""How many prompt tokens each decode step reads, and whose: chunked prefill sized by latency targets.

Every step carries the next token of each generating sequence; beside them it reads
chunks of the prompts waiting for their first token (chunked prefill, as in
Sarathi-Serve). How many is a question of time:

- **While sequences generate**, each has a time-per-output-token target
  (:mod:`.latency`). A sequence that has produced ``k`` tokens since its first is
  due its next at ``t_first + k · TPOT`` (with :data:`TPOT_SAFETY`); the step may
  last until the earliest such deadline. Streams decoding faster than their target
  bank the difference, and it is spent reading prompts. The target is a mean over
  the answer, so a stream may also fall behind by what its next
  :data:`CATCH_UP_TOKENS` tokens (or fewer, as many as it may still produce) can
  make up in steps of decodes alone: a young stream lends time to a waiting
  prompt and repays it before it ends. A stream later than that takes the next
  step alone, with no prompt read beside it (a box too slow to keep the target
  even so still gives prompts :data:`MIN_PREFILL_SHARE` of a step, at least
  :data:`MIN_PREFILL_TOKENS`). A single step never spends more than
  :data:`SLACK_CAP` targets, so a stream never stalls for long.
- **While nothing generates**, a step lasts about :data:`LONE_FRACTION` of the
  most urgent class's TTFT target: short enough that a request arriving meanwhile
  is not held up long. While several prompts are read side by side it lasts no
  longer than a TPOT target: the first to finish starts streaming at that pace, so
  a short chat beside a long document gets its first token one short step after
  it arrived. Short steps read prompts at a lower rate (each step has a fixed
  cost, and a prompt token costs less in a larger chunk), so steps last longer
  where the rate is what counts: :data:`QUEUE_FACTOR` short steps while two or
  more interactive prompts longer than a short step's reading wait (a queue); a
  whole batch a step for one prompt that would miss its TTFT target in short
  steps and makes it at the rate measured for whole batches read alone. That is
  judged on its whole length too, so it keeps those steps once ahead instead of
  finishing at the last moment. A prompt too long to make its target even so, or
  already past it, is read in short steps.
- **Small requests run on their own.** A request whose whole work (its prompt
  and every token it may produce) fits in :data:`SMALL_JOB_S` is read and decoded
  in steps that read no other prompt: a classification or a four-token answer
  beside a long document takes about its own time, and delays the document by no
  more than that. No prompt waits on small requests for more than
  :data:`OVERDUE_TARGETS` TTFT targets.

The time turns into tokens through the learned cost of a step
(:class:`.step_cost.StepCostModel`); until it has seen enough steps, through the
rate of :class:`.scheduling.StepPacer`.

Whose prompts: priority class first (``interactive`` before ``batch``); within a
class, prompts that can still get their first token within the class's TTFT
target come first, the one due soonest first (earliest deadline); prompts that
cannot any more follow, oldest first, so the wait of a long document stays
bounded by the work ahead of it. A prompt that has waited :data:`OVERDUE_TARGETS`
targets goes before both.

While interactive work runs, batch work yields inside the step: :mod:`.batch_yield`
says which batch streams decode and how many batch prompt tokens are read, and the
step's time is set by the interactive streams' deadlines alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from .batch_yield import BatchRoom, batch_room
from .context import DecodeContext
from .latency import LatencyTargets
from .logprobs import PROMPT_ROWS_PER_STEP
from .scheduling import StepPacer
from .sequence import Slot
from .step_cost import StepCostModel

#: Fewest prompt tokens a step reads while prompts wait (none while its streams are due and can catch up alone).
MIN_PREFILL_TOKENS = 16
#: Share of the next deadline's time a step plans to use (the model's error and Python's work take the rest).
TPOT_SAFETY = 0.9
#: Most banked time one step may spend, in TPOT targets of the most hurried stream.
SLACK_CAP = 6.0
#: A step nobody generates beside lasts this share of the most urgent class's TTFT target.
LONE_FRACTION = 0.0625
#: ... or this many times as long while interactive prompts queue.
QUEUE_FACTOR = 2.0
#: How much faster whole batches read alone are taken to read a prompt than short steps, until such steps were timed.
#: On the two-core box short steps were planned at 42-60 tokens (as the learned cost stood) and whole 256-token batches
#: read 600-680 tokens/s, 1.4-1.7 times that (documents of about 1,000 tokens, steps traced;
#: ``bench_prompt_chunks.py`` shows the same fall of a prompt token's cost with the chunk, which the linear step
#: cost has no term for).
FULL_BATCH_GAIN = 1.5
#: A step that reads at least this share of a batch with at most one logits row times the rate of whole batches
#: (a :class:`.scheduling.StepPacer` per regime: a weighted mean that follows the box).
FULL_BATCH_SHARE = 0.75
#: A prompt whose whole length whole batches read in up to this many TTFT targets by that rate still gets them: the
#: rate is an estimate, and moves by a fifth between runs (other slots' tokens in the cache, the box's drift).
FULL_BATCH_REACH = 1.2
#: Share of a TTFT target a prompt read in short steps is planned to fill (the steps overrun the cost's estimate).
TTFT_SAFETY = 0.85
#: When streams cannot meet their target anyway, prompt reading still gets this share of a decode's time.
MIN_PREFILL_SHARE = 0.25
#: Prompt tokens per second assumed before anything was measured (only orders prompts).
DEFAULT_RATE = 500.0
#: Output tokens over which a stream that fell behind its TPOT target is counted on to catch up.
CATCH_UP_TOKENS = 64
#: A request whose prompt and output fit in this long by the learned cost runs without other prompts read beside it.
SMALL_JOB_S = 0.3
#: A prompt waiting this many of its class's TTFT targets is read before all others of its class, small requests too.
OVERDUE_TARGETS = 3.0


def small_running(active: list[Slot]) -> bool:
    """A small request (see :meth:`StepPlanner.is_small`) is among the busy slots ``active``."""
    return any(s.seq is not None and s.seq.small for s in active)


@dataclass(frozen=True)
class Chunk:
    """The prompt tokens ``start..end`` of ``slot``'s sequence, written at batch entries from ``first``."""

    slot: Slot
    first: int
    start: int
    end: int


class RatePacer(Protocol):
    """:class:`.scheduling.StepPacer`'s interface (the compute-thread pacer of :mod:`.contention` has it too)."""

    @property
    def rate(self) -> float | None: ...
    def observe(self, tokens: int, seconds: float) -> None: ...
    def tokens(self, seconds: float, ceiling: int) -> int: ...


class StepPlanner:
    """Sizes and orders each step's prompt reading from the latency targets and the learned step cost.

    ``regime`` names the conditions a cost was measured under (the compute thread
    count): each gets its own :class:`.step_cost.StepCostModel`, so a change of team
    size does not wait for the old fit to be forgotten.
    """

    def __init__(
        self,
        targets: LatencyTargets,
        n_batch: int,
        *,
        pacer: RatePacer | None = None,
        regime: Callable[[], Hashable] | None = None,
    ) -> None:
        self.targets = targets
        self.n_batch = n_batch
        self._pacer: RatePacer = pacer if pacer is not None else StepPacer(MIN_PREFILL_TOKENS)
        self._regime = regime or (lambda: None)
        self._costs: dict[Hashable, StepCostModel] = {}
        self._full_rates: dict[Hashable, StepPacer] = {}  # prompt tokens/s of whole batches read alone, per regime

    @property
    def cost(self) -> StepCostModel:
        key = self._regime()
        model = self._costs.get(key)
        if model is None:
            model = self._costs[key] = StepCostModel()
        return model

    def expected_seconds(self, regime: Hashable, rows: int, prompt_tokens: int) -> float | None:
        """What a step of this shape costs under ``regime`` by its learned model; None until that model is ready.

        The thread governor divides a step's time by this (for the count its trial started from), so steps
        of any shape compare: a prompt-reading step with a decoding one, a short chat's with a long one's.
        """
        model = self._costs.get(regime)
        if model is None or not model.ready:
            return None
        expected = model.predict(rows, prompt_tokens)
        return expected if expected > 0.0 else None

    # -- sizing ---------------------------------------------------------------------
    def step_seconds(self, active: list[Slot], now: float) -> float:
        """How long this step may last: until the earliest next-token deadline, else a lone step."""
        allowed: float | None = None
        hurried = [s for s in active if s.seq is not None and self.targets.rank(s.seq.priority) == 0] or active
        catch_up = self._catch_up_step(active)
        for slot in hurried:  # while interactive streams run, batch streams' deadlines are kept by batch_room
            seq = slot.seq
            if seq is None or seq.n_gen == 0:
                continue
            tpot = self.targets.of(seq.priority).tpot_s
            due = seq.t_first + TPOT_SAFETY * tpot * seq.n_gen - now
            if catch_up is not None:  # what its next tokens can make up at the pace of steps that read no prompt
                due += min(CATCH_UP_TOKENS, seq.max_new - seq.n_gen) * max(0.0, TPOT_SAFETY * tpot - catch_up)
            due = min(due, SLACK_CAP * tpot)
            allowed = due if allowed is None else min(allowed, due)
        if allowed is not None:
            return allowed
        classes = {s.seq.priority for s in active if s.seq is not None} or {"interactive"}
        lone = LONE_FRACTION * min(self.targets.of(p).ttft_s for p in classes)
        longer = self._long_lone_step(active, lone, now)
        if longer is not None:
            return longer
        if sum(1 for s in active if s.seq is not None) > 1:  # prompts read side by side: the first done streams next
            return min(lone, min(self.targets.of(p).tpot_s for p in classes))
        return lone

    def _long_lone_step(self, active: list[Slot], lone: float, now: float) -> float | None:
        """A step nobody generates beside that lasts longer than ``lone``, where the rate counts; None: a short one.

        Short steps read few tokens a step, at a lower rate; they serve a request that
        arrives meanwhile, which waits for the step under way. Longer steps are taken
        while interactive prompts queue (two or more wait that a short step does not
        read whole: QUEUE_FACTOR), and a whole batch a step for a single such prompt,
        with no other prompt waiting, that misses TTFT_SAFETY of its TTFT target at the
        short steps' rate and makes the target at :meth:`full_batch_rate` (give or take
        FULL_BATCH_REACH). The short steps must make it both for the whole prompt
        against the whole target, which does not change as it is read (once ahead it is
        not dropped back to short steps to finish at the last moment), and for what is
        left against the time left (a prompt that waited for a slot, or fell behind). A
        prompt whose whole length the target does not allow even at whole batches, or
        one already past its target, is read in short steps, so a request arriving
        beside it waits little.
        """
        cost = self.cost
        if not cost.ready:
            return None
        per_short_step = self._short_step_tokens(lone)
        prompts = self.interactive_prompts(active)
        waiting = [s for s in prompts if s.prompt_left > per_short_step]
        if len(waiting) != 1:
            return QUEUE_FACTOR * lone if waiting else None
        if len(prompts) > 1:
            return None  # a chat one short step reads is waiting too: it gets its first token first
        slot = waiting[0]
        seq = slot.serving
        target = self.targets.of(seq.priority).ttft_s
        left = seq.t_submit + target - now
        whole = len(seq.prompt) - seq.cached
        if left <= 0.0 or whole / self.full_batch_rate(lone) > FULL_BATCH_REACH * target:
            return None  # past its target, or too long for it at any length

        def short(tokens: int) -> float:
            return math.ceil(tokens / per_short_step) * lone

        if short(whole) <= TTFT_SAFETY * target and short(slot.prompt_left) <= TTFT_SAFETY * left:
            return None
        return max(lone, cost.predict(1, self.n_batch))

    def full_batch_rate(self, lone: float) -> float:
        """Prompt tokens per second of whole batches read alone: as measured, else FULL_BATCH_GAIN times short steps'."""
        measured = self._full_rates.get(self._regime())
        if measured is not None and measured.rate is not None:
            return measured.rate
        return FULL_BATCH_GAIN * self._short_step_tokens(lone) / lone

    def _short_step_tokens(self, lone: float) -> int:
        """Prompt tokens a short lone step reads by the learned cost (at least one)."""
        return max(1, self.cost.prompt_tokens_within(lone, 1))

    def interactive_prompts(self, active: list[Slot]) -> list[Slot]:
        """The slots of ``active`` whose interactive-class prompt is still being read."""
        return [s for s in active if s.seq is not None and s.feed < 0 and self.targets.rank(s.seq.priority) == 0]

    def _catch_up_step(self, active: list[Slot]) -> float | None:
        """What a step of ``active``'s decodes alone costs (a late stream's step); None until the cost is known."""
        cost = self.cost
        if not cost.ready:
            return None
        return cost.predict(sum(1 for s in active if s.seq is not None and s.feed >= 0), 0)

    def is_small(self, prompt_tokens: int, max_new: int) -> bool:
        """A request reading ``prompt_tokens`` and producing up to ``max_new`` runs alone within SMALL_JOB_S.

        Alone, one row a step: the shape the cost model has seen most of, whatever else runs.
        """
        cost = self.cost
        if not cost.ready:
            return False
        return cost.predict(1, prompt_tokens) + max(0, max_new - 1) * cost.predict(1, 0) <= SMALL_JOB_S

    def small_first(self, active: list[Slot], reading: list[Slot], now: float) -> list[Slot] | None:
        """The prompts this step reads when a small request runs (only small ones); None: no small request runs now."""
        if not small_running(active):
            return None
        if any(self._overdue(slot, now) for slot in reading):
            return None  # a prompt waited long enough: it is read beside the small request
        return [s for s in reading if s.serving.small]

    def _overdue(self, slot: Slot, now: float) -> bool:
        """``slot``'s prompt has waited OVERDUE_TARGETS of its class's TTFT targets."""
        seq = slot.serving
        return now - seq.t_submit >= OVERDUE_TARGETS * self.targets.of(seq.priority).ttft_s

    def prompt_budget(self, seconds: float, rows: int, room: int) -> int:
        """Prompt tokens for a step of ``seconds`` that keeps ``rows`` logits rows; ``room`` entries are left."""
        cost = self.cost
        if cost.ready:
            decode_only = cost.predict(rows, 0)
            if rows and seconds < decode_only and decode_only < TPOT_SAFETY * self.targets.tightest_tpot_s:
                return 0  # the streams are due and a step of their decodes alone catches up: it reads no prompt
            seconds = max(seconds, decode_only * (1.0 + MIN_PREFILL_SHARE)) if rows else seconds
            tokens = cost.prompt_tokens_within(seconds, rows)
        else:
            tokens = self._pacer.tokens(seconds, self.n_batch) - rows
        return max(0, min(room, max(tokens, MIN_PREFILL_TOKENS)))

    @property
    def prompt_rate(self) -> float:
        return self.cost.prompt_rate or self._pacer.rate or DEFAULT_RATE

    def batch_room(self, active: list[Slot], now: float) -> BatchRoom | None:
        """The batch work this step may carry beside interactive work (:mod:`.batch_yield`); None: no limit."""
        return batch_room(active, now, self.targets, self.cost, MIN_PREFILL_TOKENS)

    # -- ordering ---------------------------------------------------------------------
    def order(self, reading: list[Slot], now: float) -> list[Slot]:
        """Class first; then overdue prompts, those that can still meet their TTFT target (soonest due first), the rest."""
        rate, targets = self.prompt_rate, self.targets

        def key(slot: Slot) -> tuple[int, int, float]:
            seq = slot.serving
            rank = targets.rank(seq.priority)
            if self._overdue(slot, now):
                return rank, 0, seq.t_submit
            due = seq.t_submit + targets.of(seq.priority).ttft_s
            if now + slot.prompt_left / rate <= due:
                return rank, 1, due
            return rank, 2, seq.t_submit

        return sorted(reading, key=key)

    def shares(self, reading: list[Slot], budget: int, now: float, batch_cap: int | None = None) -> list[tuple[Slot, int]]:
        """Each prompt's tokens this step: in :meth:`order`, each served as far as the budget goes.

        ``batch_cap`` bounds the tokens of batch-class prompts (what interactive work leaves them); None: no bound.
        """
        out: list[tuple[Slot, int]] = []
        for slot in self.order(reading, now):
            if budget <= 0:
                break
            seq = slot.serving
            want = slot.prompt_left
            if seq.scores_prompt:  # each row kept costs n_vocab floats of libllama's output buffer
                want = min(want, PROMPT_ROWS_PER_STEP)
            is_batch = self.targets.rank(seq.priority) > 0
            if is_batch and batch_cap is not None:
                want = min(want, batch_cap)
            give = min(want, budget)
            if give > 0:
                out.append((slot, give))
                budget -= give
                if is_batch and batch_cap is not None:
                    batch_cap -= give
        return out

    # -- learning ---------------------------------------------------------------------
    def observe(self, rows: int, prompt_tokens: int, seconds: float) -> None:
        """A step kept ``rows`` logits rows, read ``prompt_tokens`` prompt tokens and took ``seconds``."""
        self.cost.observe(rows, prompt_tokens, seconds)
        if prompt_tokens:
            self._pacer.observe(rows + prompt_tokens, seconds)
        if rows <= 1 and prompt_tokens >= FULL_BATCH_SHARE * self.n_batch:
            self._full_rates.setdefault(self._regime(), StepPacer(MIN_PREFILL_TOKENS)).observe(prompt_tokens, seconds)


def write_chunks(context: DecodeContext, shares: list[tuple[Slot, int]], n: int) -> tuple[int, list[Chunk]]:
    """Write the prompt chunks into the batch after its first ``n`` entries; returns the new count and the scored chunks.

    The last token of a prompt read to its end keeps its logits (the first output
    token is sampled from them); a prompt being scored keeps every row.
    """
    tok, pos, sids, lg = context.tok, context.pos, context.sid, context.lg
    scored: list[Chunk] = []
    for slot, share in shares:
        seq = slot.serving
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
            scored.append(Chunk(slot, n - share, start, end))
        if end == len(prompt) and seq.max_new > 0:
            lg[n - 1] = 1
            slot.out_idx = n - 1
    return n, scored
