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

:class:`.thread_trials.ThreadGovernor` is the decision, pure: fed windows of (seconds
on a CPU, seconds waiting), measured steps and the clock, it answers the thread count.
:class:`ComputeThreads` reads the statistics and applies the answer
(``llama_set_n_threads`` on every context of the worker). :class:`ThreadPacer`
keeps the rate a step's size is learned from per thread count, so work is paced by
what the current team really does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

from .scheduling import StepPacer
from .thread_trials import ContentionPolicy, ThreadGovernor

#: Adapting, with the policy's defaults (one frozen instance: safe to share).
DEFAULT_POLICY = ContentionPolicy()

__all__ = ["ComputeThreads", "ContentionPolicy", "ThreadGovernor", "ThreadPacer", "ThreadTarget", "read_schedstat"]


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
        policy: ContentionPolicy = DEFAULT_POLICY,
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
