"""The compute-thread governor: windows of (on-CPU, waiting) seconds in, thread count out.

Pure: every test drives the clock and the scheduler statistics by hand.
"""

from __future__ import annotations

import threading

import pytest

from appliance.drivers.llamacpp.contention import (
    ComputeThreads,
    ContentionPolicy,
    ThreadGovernor,
    ThreadPacer,
    box_has_room,
    read_schedstat,
)

POLICY = ContentionPolicy(window_s=0.1, high_wait=0.12, probe_s=5.0, max_probe_s=40.0)


def busy(g: ThreadGovernor, now: float, wait_share: float, seconds: float = 0.1) -> int:
    """Feed one full window with ``wait_share`` of its runnable time spent waiting."""
    return g.observe(now, seconds * (1 - wait_share), seconds * wait_share)


def test_quiet_box_keeps_every_thread():
    g = ThreadGovernor(4, POLICY)
    for i in range(200):
        assert busy(g, i * 0.1, 0.03) == 4
    assert (g.steps_down, g.steps_up) == (0, 0)


def test_contention_steps_down_one_thread_per_window_to_one():
    g = ThreadGovernor(3, POLICY)
    assert busy(g, 0.0, 0.4) == 2
    assert busy(g, 0.1, 0.4) == 1
    assert busy(g, 0.2, 0.9) == 1  # never below one
    assert g.steps_down == 2


def test_a_window_is_judged_only_once_full():
    g = ThreadGovernor(2, POLICY)
    for i in range(9):  # 0.09 s of runnable time, all of it waiting: not yet a window
        assert g.observe(i * 0.01, 0.0, 0.01) == 2
    assert g.observe(0.1, 0.0, 0.011) == 1


def test_idle_time_does_not_count_as_quiet():
    """A sleeping thread neither runs nor waits: hours idle add nothing to a window."""
    g = ThreadGovernor(2, POLICY)
    g.observe(0.0, 0.03, 0.02)
    g.observe(3600.0, 0.0, 0.0)
    assert g.observe(3600.1, 0.03, 0.03) == 1  # 0.05 of 0.11 s waited


def test_probe_up_after_probe_s_and_stay_when_quiet():
    g = ThreadGovernor(2, POLICY)
    busy(g, 0.0, 0.5)
    assert g.threads == 1
    assert busy(g, 4.9, 0.0) == 1
    assert busy(g, 5.0, 0.0) == 2  # probe
    assert g.steps_up == 1
    for i in range(1, 100):
        assert busy(g, 5.0 + i * 0.1, 0.02) == 2


def test_failed_probes_back_off_doubling_up_to_the_cap_and_reset_once_one_holds():
    g = ThreadGovernor(2, POLICY)
    k = 0  # the clock in tenths of a second (whole numbers: no drift)
    busy(g, 0.0, 0.5)  # down; next probe at 5 s

    def quiet_until_probe() -> int:
        nonlocal k
        start = k
        while g.threads == 1:
            k += 1
            busy(g, k / 10, 0.0)
        return k - start

    waits = []
    for _ in range(5):
        waits.append(quiet_until_probe())
        k += 1
        assert busy(g, k / 10, 0.5) == 1  # the probe meets the busy box again
    assert waits == [50, 100, 200, 400, 400]  # 5, 10, 20, 40 (the cap), 40 s after each step down
    quiet_until_probe()
    k += 1
    assert busy(g, k / 10, 0.0) == 2  # this probe holds
    k += 1
    busy(g, k / 10, 0.5)  # contention later, not at a probe: back to the base wait
    assert g.threads == 1
    assert quiet_until_probe() == 50
    assert g.steps_down == 7 and g.steps_up == 7


def test_climbs_back_one_thread_per_probe():
    g = ThreadGovernor(4, POLICY)
    for i in range(3):
        busy(g, i * 0.1, 0.6)
    assert g.threads == 1
    now, seen = 0.2, []
    while g.threads < 4 and now < 100:
        now += 0.1
        busy(g, now, 0.0)
        if not seen or seen[-1] != g.threads:
            seen.append(g.threads)
    assert seen == [1, 2, 3, 4]


def test_a_full_box_puts_probes_off_doubling_but_probes_at_the_cap_anyway():
    g = ThreadGovernor(2, ContentionPolicy(window_s=0.1, probe_s=1.0, max_probe_s=8.0))
    busy(g, 0.0, 0.5)
    k, tries = 0, []
    while k < 400:
        k += 1
        now = k / 10
        due = g.probe_due(now)
        assert g.observe(now, 0.1, 0.0, room=False if due else None) in (1, 2)
        if due:
            tries.append((k, g.threads))
    # put off at 1 s, 2 s later, 4 s later; at the 8 s cap it runs; it holds (quiet window) and stays
    assert [t for t, _ in tries] == [10, 30, 70, 150] and [n for _, n in tries] == [1, 1, 1, 2]
    assert g.probes_skipped == 3 and g.steps_up == 1


def test_room_on_the_box_lets_a_due_probe_run():
    g = ThreadGovernor(2, POLICY)
    busy(g, 0.0, 0.5)
    assert not g.probe_due(4.9) and g.probe_due(5.0)
    assert g.observe(5.0, 0.0, 0.0, room=True) == 2 and g.probes_skipped == 0


def test_box_has_room_reads_the_box():
    assert box_has_room(1) in (True, False)
    assert box_has_room(10_000) is False  # more threads than any CPU set holds


def test_disabled_policy_never_changes():
    g = ThreadGovernor(2, ContentionPolicy(enabled=False))
    for i in range(50):
        assert busy(g, i * 0.1, 0.9) == 2
    assert g.steps_down == 0


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


def test_compute_threads_applies_changes_to_every_target_and_reports_them():
    stat, a, b, clock = FakeStat(), Target(), Target(), [0.0]
    ct = ComputeThreads(2, [a, b], POLICY, clock=lambda: clock[0], stat=stat, room=lambda n: True)
    ct.tick()  # first reading: nothing to compare with
    stat.run, stat.wait = 0.06, 0.06
    clock[0] = 0.2
    ct.tick()
    assert a.calls == [1] and b.calls == [1]
    snap = ct.snapshot()
    assert snap["threads_current"] == 1 and snap["threads_full"] == 2
    assert snap["threads_steps_down_total"] == 1 and snap["threads_wait_share_pct"] == 50
    assert snap["threads_adaptive"] == 1
    stat.run += 0.1
    clock[0] = 5.3
    ct.tick()
    assert a.calls == [1, 2] and ct.snapshot()["threads_steps_up_total"] == 1
    assert stat.tids == {threading.get_native_id()}  # the calling (decode) thread is the one watched


def test_unreadable_statistics_keep_the_configured_threads():
    t = Target()
    ct = ComputeThreads(2, [t], POLICY, stat=lambda tid: None)
    for _ in range(3):
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
