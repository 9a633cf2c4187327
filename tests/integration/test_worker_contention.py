"""The worker gives up compute threads beside busy processes and measures two again once they stop.

A real worker on the tiny model, pinned to two CPUs with two compute threads, and
one ``while True: pass`` process pinned to each of those CPUs. Everything is
judged by the worker's own counters in ``/stats`` (threads now, switches, trials),
never by how long anything took: which count wins a trial is the worker's measurement.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.ggufkit import WorkerProcess

NO_EOS = {"2": -100}  # the tiny model's </s>: every completion runs its full length
#: Generous: the worker decides within a few tenths of a second of busy decoding; a loaded CI box may take longer.
DEADLINE_S = 180.0


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))[:2]


@contextlib.contextmanager
def hogs(cpus: list[int]) -> Iterator[list[subprocess.Popen]]:
    """One busy process pinned to each of ``cpus``, for the block's duration."""
    procs = [
        subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
        for cpu in cpus
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _worker(model: Path, sock: Path, *extra: str) -> WorkerProcess:
    w = WorkerProcess(model, sock, served_name="tiny", ctx=256, parallel=4, threads=2, extra=extra)
    w.argv = ["taskset", "-c", ",".join(map(str, _cpus())), *w.argv]  # the worker shares exactly the hogs' CPUs
    return w


def _generate(c: httpx.Client, n: int = 48) -> None:
    body = {"model": "tiny", "prompt": f"count {time.time_ns()}", "max_tokens": n, "temperature": 0, "logit_bias": NO_EOS}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == n


def _until(c: httpx.Client, done, what: str) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        _generate(c)
        stats = c.get("/stats").json()
        if done(stats):
            return stats
        assert time.monotonic() < deadline, f"{what}: {stats}"


def test_steps_down_beside_busy_processes_and_back_up_after(tiny_gguf: Path, tmp_path: Path):
    """Down: a thread given up while the hogs run. Up: once they are gone, the worker measures its full count again.

    Whether two threads then win depends on what else the box runs (a shared CI box may be as busy
    without the hogs, and the tiny model's steps are short), so "back up" is a finished trial of two
    threads after the hogs stopped, not its outcome.
    """
    probe = ("--adapt-probe-s", "0.2", "--adapt-max-probe-s", "1")
    with _worker(tiny_gguf, tmp_path / "w.sock", *probe) as w, w.sync_client() as c:
        first = c.get("/stats").json()
        assert first["threads_full"] == 2 and first["threads_adaptive"] == 1
        with hogs(_cpus()):
            down = _until(c, lambda s: s["threads_steps_down_total"] > first["threads_steps_down_total"], "never stepped down")
            assert down["threads_wait_share_pct"] > 12  # the window that decided it waited for a CPU
            for _ in range(5):  # the hogs still run: one thread at least
                _generate(c)
            during = c.get("/stats").json()
        assert during["threads_current"] in (1, 2) and during["threads_steps_down_total"] >= 1
        if during["threads_current"] == 1:  # a trial of two threads comes, and is measured, once the hogs are gone
            up = _until(
                c,
                lambda s: s["threads_trials_total"] > during["threads_trials_total"] + int(s["threads_trial_running"]),
                "never tried two threads again",
            )
            assert up["threads_full"] == 2 and up["threads_last_trial_ratio_pct"] > 0


def test_adapt_off_keeps_every_thread_beside_busy_processes(tiny_gguf: Path, tmp_path: Path):
    with _worker(tiny_gguf, tmp_path / "w.sock", "--adapt-threads", "off") as w, w.sync_client() as c, hogs(_cpus()):
        for _ in range(3):  # short: without adapting, two threads beside the hogs crawl (spinning at barriers)
            _generate(c, 8)
        stats = c.get("/stats").json()
    assert stats["threads_adaptive"] == 0
    assert (stats["threads_current"], stats["threads_steps_down_total"], stats["threads_steps_up_total"]) == (2, 0, 0)
