"""The compute-thread governor: contention asks for a trial, measured steps decide it.

Pure: every test drives the clock, the scheduler statistics and the step costs by hand.
"""

from __future__ import annotations

import math
import threading

import pytest

from appliance.drivers.llamacpp.contention import ComputeThreads, ThreadPacer, read_schedstat
from appliance.drivers.llamacpp.thread_trials import ContentionPolicy, ThreadGovernor, cheaper

POLICY = ContentionPolicy(
    window_s=0.1, high_wait=0.12, probe_s=5.0, max_probe_s=40.0, block_steps=3, rounds=3, margin=0.1, margin_down=0.25
)
SHAPE = ("step", 4, 0)


def window(g: ThreadGovernor, now: float, wait_share: float, seconds: float = 0.1) -> None:
    """Feed one full schedstat window with ``wait_share`` of its runnable time spent waiting."""
    g.observe(now, seconds * (1 - wait_share), seconds * wait_share)


class Box:
    """Drives a governor step by step: each step costs ``cost[threads]`` seconds a unit and waits ``wait`` of its time."""

    def __init__(self, g: ThreadGovernor, cost: dict[int, float], wait: float = 0.0) -> None:
        self.g, self.cost, self.wait, self.now = g, cost, wait, 0.0
        self.ran: list[int] = []

    def steps(self, n: int, shape=SHAPE) -> list[int]:
        out = []
        for _ in range(n):
            threads = self.g.threads
            seconds = self.cost[threads] * 4
            self.ran.append(threads)
            self.now += seconds
            window(self.g, self.now, self.wait, seconds)
            self.g.sample(shape, 4, seconds, self.now)
            out.append(self.g.step(self.now))
        return out

    def waits_between_trials(self, n: int) -> list[int]:
        """Seconds from the end of each trial to the start of the next, for the next ``n`` trials."""
        starts: list[float] = []
        ends: list[float] = []
        while len(starts) < n:
            before, running = self.g.trials, self.g.trial is not None
            self.steps(1)
            if self.g.trials > before:
                starts.append(self.now)
            if running and self.g.trial is None:
                ends.append(self.now)
        while self.g.trial is not None:  # the last one runs to its decision
            self.steps(1)
        return [round(b - a) for a, b in zip(ends, starts[1:], strict=False)]

    def until(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.steps(1)


def test_a_quiet_box_never_measures_and_keeps_every_thread():
    g = ThreadGovernor(4, POLICY)
    box = Box(g, {4: 0.01}, wait=0.03)
    box.until(60.0)
    assert set(box.ran) == {4} and (g.trials, g.steps_down, g.steps_up) == (0, 0, 0)


def test_contention_starts_a_trial_that_alternates_blocks_and_keeps_the_cheaper_count():
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.035}, wait=0.4)  # one thread 30% cheaper: not plain after one block
    box.steps(1)  # the window that waited starts the trial; that step is the base's first sample
    assert g.trials == 1 and g.trial is not None
    box.steps(18)
    assert box.ran[1:19] == ([1] * 3 + [2] * 3) * 3  # the candidate first: the base just ran
    assert g.threads == 1 and g.steps_down == 1 and g.trial is None
    assert g.last_ratio == pytest.approx(0.7)


def test_a_plainly_cheaper_candidate_is_kept_after_its_first_block():
    """Beside a busy process one thread measured a few percent of two threads' cost: no need to pay for more."""
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.002}, wait=0.4)
    box.steps(1 + 3)
    assert box.ran == [2, 1, 1, 1]  # the step that waited, then one block of the candidate decides
    assert g.threads == 1 and g.steps_down == 1 and g.trial is None and g.last_ratio == pytest.approx(0.04)


def test_a_margin_too_small_keeps_the_current_count():
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.04}, wait=0.4)  # one thread 20% cheaper: not enough to give up a thread
    box.steps(19)
    assert g.threads == 2 and g.steps_down == 0 and g.last_ratio == pytest.approx(0.8)
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.002}, wait=0.4)
    box.steps(4)
    box.cost, box.wait = {2: 0.0017, 1: 0.002}, 0.0  # two threads 15% cheaper: enough to take one back
    box.until(6.0)
    assert g.threads == 2 and g.steps_up == 1 and g.last_ratio == pytest.approx(0.85)


def test_waiting_that_two_threads_still_win_keeps_them_and_backs_off():
    """The daemon's own relay work makes the decode thread wait, yet two threads are faster: keep them."""
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.02, 1: 0.035}, wait=0.3)
    waits = box.waits_between_trials(5)
    # each lost trial doubles the wait before the next one of one thread fewer: 10, 20, 40 (the cap), 40 s
    assert waits == [10, 20, 40, 40], waits
    assert g.steps_down == 0 and g.threads == 2 and g.last_ratio == pytest.approx(1.75)
    assert box.ran.count(1) <= 5 * 9  # a trial runs at most its candidate blocks at the dearer count


def test_one_thread_fewer_runs_its_course_however_it_starts():
    """A smaller team costs at most about twice as much: a few noisy steps must not keep a slow team."""
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.01, 1: 0.02}, wait=0.5)
    window(g, 0.0, 0.5)
    box.steps(1 + 18)
    assert box.ran[1:19] == ([1] * 3 + [2] * 3) * 3
    assert g.trial is None and g.threads == 2 and g.last_ratio == pytest.approx(2.0)


def test_one_thread_more_plainly_dearer_ends_its_trial_after_one_block():
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.002}, wait=0.4)
    box.steps(4)
    assert g.threads == 1
    box.cost, box.wait = {2: 0.004, 1: 0.002}, 0.0  # twice as dear: plain after a block, not from one step
    box.until(5.1)
    assert g.trials == 2 and g.trial is None and g.threads == 1 and g.last_ratio == pytest.approx(2.0)
    assert box.ran[4:].count(2) == 3


def test_at_fewer_threads_a_trial_of_one_more_is_due_every_probe_s_and_wins_once_the_box_is_free():
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.02}, wait=0.4)
    box.steps(19)
    assert g.threads == 1
    box.cost = {2: 0.01, 1: 0.02}  # the busy process ended
    box.wait = 0.0
    box.until(3.0)
    assert g.trials == 1 and g.threads == 1  # not yet due
    box.until(5.0)
    assert g.trials == 2 and g.threads == 2 and g.steps_up == 1 and g.trial is None and g.last_ratio == pytest.approx(0.5)


def test_trials_of_one_more_that_lose_double_the_wait_up_to_the_cap():
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.02}, wait=0.0)
    window(g, 0.0, 0.5)
    box.steps(19)
    assert g.threads == 1
    waits = box.waits_between_trials(5)
    assert waits == [10, 20, 40, 40], waits
    assert g.threads == 1 and g.steps_up == 0


def test_steps_of_other_shapes_are_not_compared():
    g = ThreadGovernor(2, POLICY)
    window(g, 0.0, 0.5)
    g.step(0.0)
    assert g.trial is not None
    t = 0.0
    while g.trial is not None:
        t += 0.01
        shape = ("step", 1, 0) if g.threads == 2 else ("step", 8, 9)  # each arm saw another shape
        g.sample(shape, 1, 0.5 if g.threads == 2 else 0.01)
        g.step(t)
    assert g.threads == 2 and g.last_ratio is None and g.steps_down == 0


def test_a_trial_left_by_an_idle_engine_is_dropped():
    g = ThreadGovernor(2, POLICY)
    window(g, 0.0, 0.5)
    g.step(0.0)
    for i in range(4):
        g.sample(SHAPE, 1, 0.01)
        g.step(0.01 * (i + 1))
    assert g.trial is not None
    g.sample(SHAPE, 1, 0.01)
    assert g.step(3600.0) == 2 and g.trial is None and g.steps_down == 0


def test_never_below_one_thread_and_one_thread_has_nothing_to_try():
    g = ThreadGovernor(1, POLICY)
    box = Box(g, {1: 0.02}, wait=0.9)
    box.until(30.0)
    assert g.trials == 0 and set(box.ran) == {1}


def test_disabled_policy_never_changes():
    g = ThreadGovernor(2, ContentionPolicy(enabled=False))
    box = Box(g, {2: 0.05, 1: 0.01}, wait=0.9)
    box.until(20.0)
    assert g.threads == 2 and g.trials == 0


def test_cheaper_weighs_shapes_by_their_samples_and_averages_ratios_geometrically():
    base = {"a": [1.0, 1.0, 1.0, 1.0], "b": [2.0], "c": [1.0]}
    cand = {"a": [0.5, 0.5, 0.5, 0.5], "b": [4.0], "d": [0.1]}
    # a: ratio 0.5 weight 4; b: ratio 2 weight 1; c and d unmatched
    assert cheaper(base, cand) == pytest.approx(math.exp((4 * math.log(0.5) + math.log(2.0)) / 5))
    assert cheaper({"a": [1.0]}, {"b": [1.0]}) is None


class Target:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def set_threads(self, n: int) -> None:
        self.calls.append(n)


class FakeStat:
    """Cumulative (on CPU, waiting) seconds of the watched thread, advanced by hand."""

    def __init__(self) -> None:
        self.run = self.wait = 0.0
        self.tids: set[int] = set()

    def __call__(self, tid: int) -> tuple[float, float]:
        self.tids.add(tid)
        return self.run, self.wait


def test_compute_threads_applies_the_trial_to_every_target_and_reports_it():
    stat, a, b, clock = FakeStat(), Target(), Target(), [0.0]
    ct = ComputeThreads(2, [a, b], POLICY, clock=lambda: clock[0], stat=stat)
    ct.tick()  # first reading: nothing to compare with
    stat.run, stat.wait = 0.06, 0.06
    clock[0] = 0.2
    ct.tick()  # a step that measured nothing moves nothing
    assert a.calls == [] and ct.snapshot()["threads_wait_share_pct"] == 50
    cost = {2: 0.05, 1: 0.035}
    for _ in range(19):
        ct.sample(SHAPE, 1, cost[ct.threads])
        clock[0] += 0.05
        ct.tick()
    assert a.calls == [1, 2, 1, 2, 1, 2, 1] and b.calls == a.calls  # three blocks of each, then the cheaper kept
    snap = ct.snapshot()
    assert snap["threads_current"] == 1 and snap["threads_full"] == 2 and snap["threads_adaptive"] == 1
    assert (snap["threads_steps_down_total"], snap["threads_trials_total"], snap["threads_trial_running"]) == (1, 1, 0)
    assert snap["threads_last_trial_ratio_pct"] == 70
    assert stat.tids == {threading.get_native_id()}  # the calling (decode) thread is the one watched


def test_unreadable_statistics_keep_the_configured_threads():
    t = Target()
    ct = ComputeThreads(2, [t], POLICY, stat=lambda tid: None)
    for _ in range(3):
        ct.sample(SHAPE, 1, 0.5)
        ct.tick()
    assert t.calls == [] and ct.snapshot()["threads_adaptive"] == 0 and ct.threads == 2


def test_read_schedstat_reads_this_thread():
    got = read_schedstat(threading.get_native_id())
    assert got is not None and got[0] > 0.0 and got[1] >= 0.0
    assert read_schedstat(2**31 - 1) is None


def test_thread_pacer_learns_one_rate_per_thread_count():
    n = [2]
    p = ThreadPacer(16, lambda: n[0])
    assert p.tokens(0.2, 256) == 16  # nothing measured yet: the floor
    p.observe(200, 1.0)  # 200 tokens/s at two threads
    assert p.tokens(0.2, 256) == 40
    n[0] = 1
    assert p.rate == pytest.approx(100.0)  # unmeasured count: scaled from the nearest measured one
    for _ in range(30):
        p.observe(120, 1.0)
    assert p.rate == pytest.approx(120.0, rel=1e-3) and p.tokens(0.2, 256) in (23, 24)
    n[0] = 2
    assert p.tokens(0.2, 256) == 40  # the two-thread rate was kept
    n[0] = 4
    assert p.rate == pytest.approx(200.0)  # more threads are not assumed faster until measured


def test_engine_adapt_threads_setting_reaches_the_worker_argv(tmp_path):
    from types import SimpleNamespace

    from appliance.drivers.llamacpp.driver import LlamaCppDriver
    from appliance.drivers.llamacpp.worker import parse_args
    from appliance.settings import Settings

    plan = SimpleNamespace(model_path="/m.gguf", context=512, parallel=2, threads=2, n_gpu_layers=0, model="m")
    for value, flag in ((True, "on"), (False, "off")):
        settings = Settings(data_dir=tmp_path, engine_adapt_threads=value)
        args = parse_args(LlamaCppDriver().command(plan, tmp_path / "s.sock", settings)[3:])
        assert args.adapt_threads == flag


def test_steps_from_before_an_idle_gap_do_not_stand_for_the_base():
    g = ThreadGovernor(2, POLICY)
    for _ in range(2):  # quiet and cheap, long ago
        g.sample(SHAPE, 1, 0.001, 0.0)
        g.step(0.0)
    window(g, 30.0, 0.5)
    g.sample(SHAPE, 1, 0.05, 30.0)  # the step that waited
    g.step(30.0)
    assert g.trial is not None and g.trial.samples == {2: {SHAPE: [0.05]}}


def test_a_candidate_far_dearer_from_its_first_step_ends_the_trial_after_that_step():
    """A trial of two threads beside a busy process: its first step costs many times one thread's; no second one."""
    g = ThreadGovernor(2, POLICY)
    box = Box(g, {2: 0.05, 1: 0.002}, wait=0.4)
    box.steps(4)
    assert g.threads == 1
    box.wait = 0.0
    box.until(5.2)
    assert g.trials == 2 and g.trial is None and g.threads == 1
    assert box.ran[4:].count(2) == 1 and g.last_ratio == pytest.approx(25.0)


def test_steps_before_the_busy_process_came_do_not_stand_for_the_base():
    """The steps just before a neighbour appeared were cheap; a trial compares with the ones that waited."""
    g = ThreadGovernor(2, POLICY)
    g.sample(SHAPE, 1, 0.001, 0.0)  # quiet
    window(g, 0.05, 0.0)
    g.step(0.05)
    g.sample(SHAPE, 1, 0.05, 0.2)  # the busy process started: this step waited
    window(g, 0.2, 0.5)
    g.step(0.2)
    assert g.trial is not None and g.trial.samples == {2: {SHAPE: [0.05]}}
