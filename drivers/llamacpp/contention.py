"""Compute threads that give way when other work takes the box's cores.

llama.cpp's CPU backend (built by pip with OpenMP) runs each graph as a team of
threads that meet at a barrier after every node. When the kernel deschedules one
of them for another process, the rest spin at the next barrier until it is back,
so a box with one busy process beside a two-thread engine decodes a 4-token chat
in about a second (up to nine) instead of 0.1 s; the same engine on one thread
stays at 0.2 s. Fewer threads than the cores left free beats more threads than that.

The signal is the decode thread's own scheduler statistics
(``/proc/self/task/<tid>/schedstat``: time on a CPU and time waiting on a run
queue). That thread leads every graph, so the share of its runnable time spent
waiting is the share of each step its team lost to others. It needs no calibration,
ignores idle time (a sleeping thread neither runs nor waits), and costs one small
read per judgement.

:class:`ThreadGovernor` is the decision, pure: fed windows of (seconds on a CPU,
seconds waiting), it answers the thread count. Above :attr:`ContentionPolicy.high_wait`
it steps down one thread; after :attr:`ContentionPolicy.probe_s` at fewer threads it
steps one back up to see whether the box is free again, and a probe that meets
contention at once doubles the wait before the next (up to
:attr:`ContentionPolicy.max_probe_s`). :class:`ComputeThreads` reads the statistics
and applies the answer (``llama_set_n_threads`` on every context of the worker),
asking the box first whether a core is free for a probe (:func:`box_has_room`), so
a plainly full box does not pay a probe's slow step each time. :class:`ThreadPacer`
keeps the rate a step's size is learned from per thread count,
so work is paced by what the current team really does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from .scheduling import StepPacer


@dataclass(frozen=True)
class ContentionPolicy:
    """When the compute team shrinks and when it tries to grow back."""

    #: Adapt at all (off: the configured threads always).
    enabled: bool = True
    #: Runnable seconds of the decode thread judged together.
    window_s: float = 0.1
    #: Share of runnable time spent waiting for a CPU above which a thread is given up.
    high_wait: float = 0.12
    #: Seconds at fewer threads before one is tried again.
    probe_s: float = 5.0
    #: Longest wait between probes after probes that met contention again (or were put off: no core free).
    max_probe_s: float = 60.0


class ThreadGovernor:
    """The thread count for windows of observed CPU and run-queue time (pure: the caller supplies ``now``)."""

    def __init__(self, full: int, policy: ContentionPolicy = ContentionPolicy()) -> None:
        self.full = max(1, full)
        self.policy = policy
        self.threads = self.full
        self.steps_down = 0
        self.steps_up = 0
        self.probes_skipped = 0
        self.last_wait_share = 0.0
        self._run = 0.0
        self._wait = 0.0
        self._probing = False  # the window after a step up decides whether it holds
        self._backoff = policy.probe_s
        self._next_probe: float | None = None

    def probe_due(self, now: float) -> bool:
        """Whether the next :meth:`observe` at ``now`` would try one more thread (ask the box for ``room`` then)."""
        return self._next_probe is not None and now >= self._next_probe and self.threads < self.full

    def observe(self, now: float, run_s: float, wait_s: float, room: bool | None = None) -> int:
        """Add ``run_s`` seconds on a CPU and ``wait_s`` seconds waiting for one; returns the thread count to use.

        ``room`` (asked only when :meth:`probe_due`): whether the box has a core free for one more thread.
        False postpones a due probe as if it had failed (a failed probe costs a slow step), except once the
        wait has reached :attr:`ContentionPolicy.max_probe_s`: then the probe runs anyway, since the hint
        is only a sample.
        """
        p = self.policy
        if not p.enabled:
            return self.threads
        self._run += max(0.0, run_s)
        self._wait += max(0.0, wait_s)
        total = self._run + self._wait
        if total >= p.window_s:
            share = self._wait / total
            self.last_wait_share = share
            self._run = self._wait = 0.0
            self._judge(now, share)
        if self.probe_due(now):
            cap = max(p.max_probe_s, p.probe_s)
            if room is False and self._backoff < cap:
                self.probes_skipped += 1
                self._backoff = min(cap, self._backoff * 2)
                self._next_probe = now + self._backoff
                return self.threads
            self.threads += 1
            self.steps_up += 1
            self._probing = True
            self._next_probe = None
        return self.threads

    def _judge(self, now: float, share: float) -> None:
        p = self.policy
        probing, self._probing = self._probing, False
        if share > p.high_wait and self.threads > 1:
            self.threads -= 1
            self.steps_down += 1
            # a probe that met contention at once: wait longer before the next
            self._backoff = min(max(p.max_probe_s, p.probe_s), self._backoff * 2) if probing else p.probe_s
            self._next_probe = now + self._backoff
        elif probing:  # the step up held: keep climbing at the base pace
            self._backoff = p.probe_s
            if self.threads < self.full:
                self._next_probe = now + p.probe_s
        elif self.threads < self.full and self._next_probe is None:
            self._next_probe = now + self._backoff


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


def box_has_room(threads: int) -> bool | None:
    """Whether this process's CPUs have a core free for one more compute thread; None where unknown.

    ``/proc/loadavg``'s fourth field counts the box's runnable tasks at this instant,
    the calling (decode) thread and the team's spinning threads among them, so one
    more thread fits when that count is below the CPUs this process may use. One
    sample is a hint, not a measurement: :meth:`ThreadGovernor.observe` says how it is used.
    """
    import os

    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        cores = len(os.sched_getaffinity(0))
    except (OSError, ValueError, IndexError):
        return None
    return max(running, threads) + 1 <= cores


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
        room: Callable[[int], bool | None] = box_has_room,
    ) -> None:
        import time

        self.governor = ThreadGovernor(full, policy)
        self._targets = list(targets)
        self._clock = clock or time.monotonic
        self._stat = stat
        self._room = room
        self._tid: int | None = None
        self._last: tuple[float, float] | None = None
        self.signal = "schedstat" if policy.enabled else "off"

    @property
    def threads(self) -> int:
        return self.governor.threads

    def add_target(self, target: ThreadTarget) -> None:
        """A context created later (the embedding context, on first use) joins at the current count."""
        self._targets.append(target)
        if self.governor.threads != self.governor.full:
            target.set_threads(self.governor.threads)

    def tick(self) -> None:
        if self.signal != "schedstat":
            return
        if self._tid is None:
            self._tid = threading.get_native_id()
        now = self._stat(self._tid)
        if now is None:
            self.signal = "unavailable"  # no schedstat on this kernel: keep the configured threads
            return
        last, self._last = self._last, now
        if last is None:
            return
        g, t = self.governor, self._clock()
        before = g.threads
        room = self._room(before) if g.probe_due(t) else None
        after = g.observe(t, now[0] - last[0], now[1] - last[1], room)
        if after != before:
            for target in self._targets:
                target.set_threads(after)

    def pacer(self, floor: int) -> ThreadPacer:
        """A step pacer whose learned rate belongs to the current thread count."""
        return ThreadPacer(floor, lambda: self.governor.threads)

    def snapshot(self) -> dict[str, int]:
        """The worker's ``/stats`` fields: configured and current threads, steps each way, the last window's wait share."""
        g = self.governor
        return {
            "threads_full": g.full,
            "threads_current": g.threads,
            "threads_steps_down_total": g.steps_down,
            "threads_steps_up_total": g.steps_up,
            "threads_probes_skipped_total": g.probes_skipped,
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
