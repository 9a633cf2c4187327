"""How many prompt tokens each decode step reads, and whose: chunked prefill sized by latency targets.

Every step carries the next token of each generating sequence; beside them it reads
chunks of the prompts waiting for their first token (chunked prefill, as in
Sarathi-Serve). How many is a question of time:

- **While sequences generate**, each has a time-per-output-token target
  (:mod:`.latency`). A sequence that has produced ``k`` tokens since its first is
  due its next at ``t_first + k · TPOT`` (with :data:`TPOT_SAFETY`); the step may
  last until the earliest such deadline. Streams decoding faster than their target
  bank the difference, and it is spent reading prompts; a stream running late
  leaves a step only the :data:`MIN_PREFILL_TOKENS` floor of prompt reading (and a
  box too slow to meet the target at all still gives prompts
  :data:`MIN_PREFILL_SHARE` of a step). A single step never spends more than
  :data:`SLACK_CAP` targets of banked time, so a stream never stalls visibly.
- **While nothing generates**, a step lasts about :data:`LONE_FRACTION` of the
  most urgent class's TTFT target: long enough to read efficiently, short enough
  that a request arriving meanwhile is not held up. While several prompts are
  read side by side it lasts no longer than a TPOT target: the first to finish
  starts streaming at that pace, so a short chat beside a long document gets its
  first token one short step after it arrived.

The time turns into tokens through the learned cost of a step
(:class:`.step_cost.StepCostModel`); until it has seen enough steps, through the
rate of :class:`.scheduling.StepPacer`.

Whose prompts: priority class first (``interactive`` before ``batch``), then the
shortest remaining read, where time already waited counts as reading done (a
prompt that has waited as long as its remaining read would take is ahead of any
newcomer): short chats are answered at once beside a long document, and the long
one still waits at most about its own reading time.

While interactive work runs, batch work yields inside the step: :mod:`.batch_yield`
says which batch streams decode and how many batch prompt tokens are read, and the
step's time is set by the interactive streams' deadlines alone.
"""

from __future__ import annotations

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

#: Fewest prompt tokens a step reads while prompts wait, whatever the targets say.
MIN_PREFILL_TOKENS = 16
#: Share of the next deadline's time a step plans to use (the model's error and Python's work take the rest).
TPOT_SAFETY = 0.9
#: Most banked time one step may spend, in TPOT targets of the most hurried stream.
SLACK_CAP = 3.0
#: A step nobody generates beside lasts this share of the most urgent class's TTFT target.
LONE_FRACTION = 0.125
#: When streams cannot meet their target anyway, prompt reading still gets this share of a decode's time.
MIN_PREFILL_SHARE = 0.25
#: Prompt tokens per second assumed before anything was measured (only orders prompts).
DEFAULT_RATE = 500.0


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
        for slot in hurried:  # while interactive streams run, batch streams' deadlines are kept by batch_room
            seq = slot.seq
            if seq is None or seq.n_gen == 0:
                continue
            tpot = self.targets.of(seq.priority).tpot_s
            due = seq.t_first + TPOT_SAFETY * tpot * seq.n_gen - now
            due = min(due, SLACK_CAP * tpot)
            allowed = due if allowed is None else min(allowed, due)
        if allowed is not None:
            return allowed
        classes = {s.seq.priority for s in active if s.seq is not None} or {"interactive"}
        lone = LONE_FRACTION * min(self.targets.of(p).ttft_s for p in classes)
        if sum(1 for s in active if s.seq is not None) > 1:  # prompts read side by side: the first done streams next
            return min(lone, min(self.targets.of(p).tpot_s for p in classes))
        return lone

    def prompt_budget(self, seconds: float, rows: int, room: int) -> int:
        """Prompt tokens for a step of ``seconds`` that keeps ``rows`` logits rows; ``room`` entries are left."""
        cost = self.cost
        if cost.ready:
            decode_only = cost.predict(rows, 0)
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
        """Class first, then the shortest remaining read less the time already waited."""
        rate, targets = self.prompt_rate, self.targets

        def key(slot: Slot) -> tuple[int, float]:
            seq = slot.serving
            remaining = len(seq.prompt) - len(slot.tokens)
            return targets.rank(seq.priority), remaining / rate - (now - seq.t_submit)

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
            want = len(seq.prompt) - len(slot.tokens)
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
