"""Compute threads that give way when other work takes the box's cores, kept only where that is faster.

llama.cpp's CPU backend (built by pip with OpenMP) runs each graph as a team of
threads that meet at a barrier after every node. When the kernel deschedules one
of them for another process, the rest spin at the next barrier until it is back,
so a box with one busy process beside a two-thread engine decodes a 4-token chat
in about a second (up to nine) instead of 0.1 s; the same engine on one thread
stays at 0.2 s. Fewer threads than the cores left free beats more threads than that.

But waiting for a CPU is not proof that fewer threads would be faster: on a
two-core box the daemon's own relay work (the gateway answering the stream the
worker produces) makes the decode thread wait too, and there two threads still
beat one. So contention only *asks* the question, and a measurement answers it:

- The signal is the decode thread's own scheduler statistics
  (``/proc/self/task/<tid>/schedstat``: time on a CPU and time waiting on a run
  queue). Above :attr:`ContentionPolicy.high_wait` of its runnable time spent
  waiting, a **trial** of one thread fewer is due.
- A trial runs the next steps alternately at the candidate and at the current
  count, in blocks of :attr:`ContentionPolicy.block_steps` (the first step of each
  block is not counted: it pays for the switch), for :attr:`ContentionPolicy.rounds`
  rounds, the candidate first: the steps that just ran (and waited) stand for the
  current count's first block. Each step's seconds per unit of work are compared only
  with steps of the same shape in the other arm; the candidate wins when it is at
  least :attr:`ContentionPolicy.margin` cheaper (:attr:`ContentionPolicy.margin_down`
  for one thread fewer). At the end of any block a candidate
  plainly faster (:attr:`ContentionPolicy.give_up`) decides the trial there. A
  candidate of one thread more that is plainly slower ends it there too, or at once
  when its very first step (switch included) cost twice that: beside a busy process
  a step of a team too large costs seconds. A trial of one thread fewer runs its
  course (that team costs at most about twice as much), so a few noisy steps cannot
  keep a slow team.
- At fewer threads than configured, a trial of one more is due every
  :attr:`ContentionPolicy.probe_s`; a trial lost doubles the wait before the next
  of the same kind (up to :attr:`ContentionPolicy.max_probe_s`), one won resets it.

:class:`ThreadGovernor` is the decision, pure: fed windows of (seconds on a CPU,
seconds waiting), measured steps and the clock, it answers the thread count.
:class:`ComputeThreads` reads the statistics and applies the answer
(``llama_set_n_threads`` on every context of the worker). :class:`ThreadPacer`
keeps the rate a step's size is learned from per thread count, so work is paced by
what the current team really does.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .scheduling import StepPacer

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
    switched: Samples = field(default_factory=dict)  # the candidate's step just after a switch, not counted
    _fresh: bool = True  # the step now running is the first of its block

    @property
    def count(self) -> int:
        return self.schedule[self.index]

    def add(self, shape: Hashable, per_unit: float) -> None:
        if not self._fresh:
            self.samples.setdefault(self.count, {}).setdefault(shape, []).append(per_unit)
        elif self.count == self.candidate:  # a switch only adds cost: enough to show a candidate far dearer
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
            far = trial.far_dearer(2 * self.policy.give_up)
            if grow and far is not None:  # no second step of a team too large
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


class ThreadTarget(Protocol):
    """Something that computes graphs with a settable number of threads (a llama.cpp context)."""

    def set_threads(self, n: int) -> None: ...


def read_schedstat(tid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting on a run queue) of thread ``tid`` of this process; None where unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class ComputeThreads:
    """The worker's compute team size: watches the decode thread, applies the governor's answer to every target.

    Call :meth:`tick` on the decode thread after each step (it reads that thread's
    statistics, so it must run there). ``clock`` and ``stat`` are handed in so the
    policy can be driven by tests; the defaults read the real ones.
    """

    def __init__(
        self,
        full: int,
        targets: Iterable[ThreadTarget],
        policy: ContentionPolicy = ContentionPolicy(),
        *,
        clock: Callable[[], float] | None = None,
        stat: Callable[[int], tuple[float, float] | None] = read_schedstat,
    ) -> None:
        import time

        self.governor = ThreadGovernor(full, policy)
        self._targets = list(targets)
        self._clock = clock or time.monotonic
        self._stat = stat
        self._tid: int | None = None
        self._last: tuple[float, float] | None = None
        self._sampled = False
        self.signal = "schedstat" if policy.enabled else "off"

    @property
    def threads(self) -> int:
        return self.governor.threads

    @property
    def base_threads(self) -> int:
        """The count a running trial compares against (else the current count): what work is normalised to."""
        trial = self.governor.trial
        return trial.base if trial is not None else self.governor.threads

    def add_target(self, target: ThreadTarget) -> None:
        """A context created later (the embedding context, on first use) joins at the current count."""
        self._targets.append(target)
        if self.governor.threads != self.governor.full:
            target.set_threads(self.governor.threads)

    def sample(self, shape: Hashable, work: float, seconds: float) -> None:
        """A piece of work of ``shape`` and ``work`` units took ``seconds`` at the current count (see :meth:`tick`)."""
        if self.signal == "schedstat":
            self.governor.sample(shape, work, seconds, self._clock())
            self._sampled = True

    def tick(self) -> None:
        """After each step, on the thread that leads the graphs: read its statistics, apply the governor's answer.

        A step that measured nothing (:meth:`sample` not called since the last tick) does not move a trial on.
        """
        if self.signal != "schedstat":
            return
        if self._tid is None:
            self._tid = threading.get_native_id()
        now = self._stat(self._tid)
        if now is None:
            self.signal = "unavailable"  # no schedstat on this kernel: keep the configured threads
            return
        last, self._last = self._last, now
        g, t = self.governor, self._clock()
        if last is not None:
            g.observe(t, now[0] - last[0], now[1] - last[1])
        if not self._sampled:
            return
        self._sampled = False
        before = g.threads
        after = g.step(t)
        if after != before:
            for target in self._targets:
                target.set_threads(after)

    def pacer(self, floor: int) -> ThreadPacer:
        """A step pacer whose learned rate belongs to the current thread count."""
        return ThreadPacer(floor, lambda: self.governor.threads)

    def snapshot(self) -> dict[str, int]:
        """The worker's ``/stats`` fields: configured and current threads, switches each way, trials, the last wait share.

        ``threads_last_trial_ratio_pct``: the last trial's candidate cost per unit of work as a percentage of
        its base's (below 100: the candidate was cheaper), -1 before any trial or when it measured nothing comparable.
        """
        g = self.governor
        return {
            "threads_full": g.full,
            "threads_current": g.threads,
            "threads_steps_down_total": g.steps_down,
            "threads_steps_up_total": g.steps_up,
            "threads_trials_total": g.trials,
            "threads_trial_running": int(g.trial is not None),
            "threads_last_trial_ratio_pct": -1 if g.last_ratio is None else int(round(g.last_ratio * 100)),
            "threads_wait_share_pct": int(round(g.last_wait_share * 100)),
            "threads_adaptive": int(self.signal == "schedstat"),
        }


class ThreadPacer:
    """:class:`.scheduling.StepPacer`'s interface, with one learned rate per compute thread count.

    A count not yet measured starts from a measured one scaled by the thread ratio
    (the conservative side: fewer threads are assumed no faster per thread), so the
    first step after a change is sized for the team that runs it.
    """

    def __init__(self, floor: int, threads: Callable[[], int]) -> None:
        self.floor = floor
        self._threads = threads
        self._pacers: dict[int, StepPacer] = {}

    def _current(self) -> StepPacer:
        n = self._threads()
        pacer = self._pacers.get(n)
        if pacer is None:
            pacer = self._pacers[n] = StepPacer(self.floor)
            known = [(m, q.rate) for m, q in self._pacers.items() if q.rate is not None]
            if known:
                m, rate = min(known, key=lambda kv: abs(kv[0] - n))
                pacer.rate = rate * min(1.0, n / m)
        return pacer

    @property
    def rate(self) -> float | None:
        return self._current().rate

    def observe(self, tokens: int, seconds: float) -> None:
        self._current().observe(tokens, seconds)

    def tokens(self, seconds: float, ceiling: int) -> int:
        return self._current().tokens(seconds, ceiling)
