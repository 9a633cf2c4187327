"""The thread-count decision, pure: contention windows and measured steps in, a thread count out.

See :mod:`.contention` for why and how: waiting for a CPU asks for a trial, and a trial
of the current count against one thread more or fewer, measured in alternating blocks
of steps, answers it. Nothing here reads the clock or the kernel; the caller supplies both.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Hashable
from dataclasses import dataclass, field

#: Samples of one arm: seconds per unit of work, by the step's shape.
Samples = dict[Hashable, list[float]]


@dataclass(frozen=True)
class ContentionPolicy:
    """When the compute team is measured at another size, and when the measurement is believed."""

    #: Adapt at all (off: the configured threads always).
    enabled: bool = True
    #: Runnable seconds of the decode thread judged together.
    window_s: float = 0.1
    #: Share of runnable time spent waiting for a CPU above which a trial of one thread fewer is due.
    high_wait: float = 0.12
    #: Seconds at fewer threads before a trial of one more; also the least wait between two trials of one fewer.
    probe_s: float = 5.0
    #: Longest wait before a trial of the same kind, after trials that lost.
    max_probe_s: float = 60.0
    #: Steps in a row at one count within a trial (the first of them is not counted).
    block_steps: int = 3
    #: Blocks of each count in a trial.
    rounds: int = 3
    #: How much cheaper per unit of work a candidate of one thread more must be to be kept.
    margin: float = 0.10
    #: How much cheaper one thread fewer must be to be kept: beside a busy process it measures several
    #: times cheaper, while a smaller team kept by chance on a box that is not contended costs a third
    #: of its speed until the next trial of one more.
    margin_down: float = 0.25
    #: A candidate this much dearer (or cheaper: its inverse) after its first block decides the trial there.
    give_up: float = 1.5
    #: A trial not finished within this many seconds (the engine went idle) is dropped.
    stale_s: float = 30.0


def cheaper(base: Samples, candidate: Samples) -> float | None:
    """The candidate's cost relative to the base (0.8: 20% cheaper), over the shapes both measured; None if none.

    Per shape, the ratio of the medians; shapes are weighted by the fewer samples of the two arms,
    and the ratios averaged geometrically (a 2x and a 0.5x cancel).
    """
    num = den = 0.0
    for shape, cand in candidate.items():
        ref = base.get(shape)
        if not ref or not cand:
            continue
        b, c = statistics.median(ref), statistics.median(cand)
        if b <= 0.0 or c <= 0.0:
            continue
        w = float(min(len(ref), len(cand)))
        num += w * math.log(c / b)
        den += w
    return math.exp(num / den) if den else None


@dataclass
class Trial:
    """One measured comparison of ``base`` threads against ``candidate`` threads."""

    base: int
    candidate: int
    started: float
    schedule: list[int]
    index: int = 0
    samples: dict[int, Samples] = field(default_factory=dict)
    switched: Samples = field(default_factory=dict)  # a larger candidate's step just after a switch, not counted
    _fresh: bool = True  # the step now running is the first of its block

    @property
    def count(self) -> int:
        return self.schedule[self.index]

    def add(self, shape: Hashable, per_unit: float) -> None:
        if not self._fresh:
            self.samples.setdefault(self.count, {}).setdefault(shape, []).append(per_unit)
        elif self.count == self.candidate > self.base:  # a switch only adds cost: enough to show a larger team far dearer
            self.switched.setdefault(shape, []).append(per_unit)

    def far_dearer(self, factor: float) -> float | None:
        """The candidate's first step after a switch against the base, when it cost ``factor`` times or more."""
        first, self.switched = self.switched, {}
        ratio = cheaper(self.samples.get(self.base, {}), first) if first else None
        return ratio if ratio is not None and ratio >= factor else None

    def advance(self) -> bool:
        """The step ran; True once the schedule is done."""
        self.index += 1
        if self.index >= len(self.schedule):
            return True
        self._fresh = self.schedule[self.index] != self.schedule[self.index - 1]
        return False

    def ratio(self) -> float | None:
        return cheaper(self.samples.get(self.base, {}), self.samples.get(self.candidate, {}))

    def block_done(self) -> bool:
        """The step just counted ended a block (the next one runs the other count)."""
        return self._fresh


class ThreadGovernor:
    """The thread count from contention windows and measured trials (pure: the caller supplies ``now``)."""

    def __init__(self, full: int, policy: ContentionPolicy = ContentionPolicy()) -> None:
        self.full = max(1, full)
        self.policy = policy
        self.threads = self.full
        self.steps_down = 0
        self.steps_up = 0
        self.trials = 0
        self.last_wait_share = 0.0
        self.last_ratio: float | None = None  # the last trial's candidate cost relative to its base
        self.trial: Trial | None = None
        self._run = 0.0
        self._wait = 0.0
        self._contended = False  # a window since the last trial waited above high_wait
        self._backoff_down = policy.probe_s
        self._backoff_up = policy.probe_s
        self._next_down = 0.0
        self._next_up: float | None = None
        # the last steps' samples outside a trial: a trial starting now counts them for the current count
        self._recent: collections.deque[tuple[float, Hashable, float]] = collections.deque(maxlen=max(2, policy.block_steps))

    def observe(self, now: float, run_s: float, wait_s: float) -> None:
        """Add ``run_s`` seconds on a CPU and ``wait_s`` seconds waiting for one (the decode thread's)."""
        if not self.policy.enabled:
            return
        self._run += max(0.0, run_s)
        self._wait += max(0.0, wait_s)
        total = self._run + self._wait
        if total >= self.policy.window_s:
            self.last_wait_share = self._wait / total
            self._run = self._wait = 0.0
            if self.last_wait_share > self.policy.high_wait:
                self._contended = True
            elif self.trial is None:
                self._recent.clear()  # steps of a window that did not wait do not stand for a contended count

    def sample(self, shape: Hashable, work: float, seconds: float, now: float = 0.0) -> None:
        """A piece of work of ``shape`` (``work`` units of it) took ``seconds`` at the current count, ending at ``now``."""
        if work <= 0 or seconds <= 0:
            return
        if self.trial is not None:
            self.trial.add(shape, seconds / work)
        elif self.policy.enabled:
            self._recent.append((now, shape, seconds / work))

    def step(self, now: float) -> int:
        """One step (that measured something) ended at ``now``; returns the thread count for the next."""
        if not self.policy.enabled:
            return self.threads
        trial = self.trial
        if trial is not None:
            if now - trial.started > self.policy.stale_s:
                self.trial = None  # the engine went idle mid-trial: the samples are from another box
                self.threads = trial.base
                self._schedule_after(now, trial, won=None)
                return self.threads
            # Ending early because the candidate costs more is for trials of one thread MORE: beside a busy
            # process a step of a team too large costs seconds. One thread fewer costs at most about twice
            # as much, so that trial runs its course: a few noisy steps must not keep a slow team.
            grow = trial.candidate > trial.base
            far = trial.far_dearer(2 * self.policy.give_up)  # only a larger team's switch steps are kept for this
            if far is not None:  # no second step of a team too large
                self._finish(now, trial, far)
                return self.threads
            done = trial.advance()
            if done:
                self._finish(now, trial, trial.ratio())
            elif trial.block_done() and (
                (early := trial.ratio()) is not None
                and ((grow and early >= self.policy.give_up) or early <= 1.0 / self.policy.give_up)
            ):
                self._finish(now, trial, early)  # plainly better, or a larger team plainly worse: no need to pay for more
            else:
                self.threads = trial.count
            return self.threads
        p = self.policy
        if self._contended and self.threads > 1 and now >= self._next_down:
            self._start(now, self.threads - 1)
        elif self.threads < self.full and self._next_up is not None and now >= self._next_up:
            self._start(now, self.threads + 1)
        elif self.threads < self.full and self._next_up is None:
            self._next_up = now + p.probe_s
        return self.threads

    def _start(self, now: float, candidate: int) -> None:
        """A trial of ``candidate`` threads, candidate first: the steps that just ran are the base's first block.

        Those steps are the ones that waited (or, for a trial of one more, the current count as it runs
        now), so the first comparison needs only the candidate's block, and a plainly better count is
        kept after it; the base's slow steps are not run again first.
        """
        p = self.policy
        block = max(2, p.block_steps)
        schedule = ([candidate] * block + [self.threads] * block) * max(1, p.rounds)
        self.trial = Trial(self.threads, candidate, now, schedule)
        for t, shape, per_unit in self._recent:
            if now - t <= p.window_s * 20:
                self.trial.samples.setdefault(self.threads, {}).setdefault(shape, []).append(per_unit)
        self._recent.clear()
        self.trials += 1
        self._contended = False
        self.threads = self.trial.count

    def _finish(self, now: float, trial: Trial, ratio: float | None) -> None:
        self.trial = None
        self._recent.clear()
        self.last_ratio = ratio
        margin = self.policy.margin_down if trial.candidate < trial.base else self.policy.margin
        won = ratio is not None and ratio <= 1.0 - margin
        if won:
            self.threads = trial.candidate
            if trial.candidate < trial.base:
                self.steps_down += 1
            else:
                self.steps_up += 1
        else:
            self.threads = trial.base
        self._schedule_after(now, trial, won=won if ratio is not None else None)

    def _schedule_after(self, now: float, trial: Trial, won: bool | None) -> None:
        """When the next trials are due: a lost one doubles its kind's wait, a won one resets both."""
        p = self.policy
        cap = max(p.max_probe_s, p.probe_s)
        down = trial.candidate < trial.base
        if won:
            self._backoff_down = self._backoff_up = p.probe_s
        elif won is False:
            if down:
                self._backoff_down = min(cap, self._backoff_down * 2)
            else:
                self._backoff_up = min(cap, self._backoff_up * 2)
        self._next_down = now + (self._backoff_down if down or won else p.probe_s)
        self._next_up = now + self._backoff_up if self.threads < self.full else None
        self._contended = False
