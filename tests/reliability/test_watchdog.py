"""The systemd watchdog, daemon-level (reliability-table row 18; the loop itself: tests/unit/test_sdnotify.py).

The daemon runs as systemd would start it with ``WatchdogSec=1``: a
``NOTIFY_SOCKET`` (a datagram socket this test binds) and ``WATCHDOG_USEC``.
What must hold: ``READY=1`` arrives once the daemon serves; ``WATCHDOG=1``
pings keep coming, never further apart than WatchdogSec; when the daemon is
stopped (SIGSTOP: its event loop cannot run) the pings stop, so systemd would
kill and restart it after WatchdogSec; after SIGCONT they resume; SIGTERM
sends ``STOPPING=1``.

A stalled event loop while the process runs: another SQLite writer holds the
database (an admin's ``sqlite3`` shell, a restore) while a request with a quota
is admitted. Its reservation waits in the ledger's writer thread, which holds
the meter's connection while SQLite's busy handler waits for the lock (up to
10 s at a time); a second key's request, whose limits are not cached yet, reads
them on the event loop through that connection and so stalls the loop behind
it. The test keeps the lock until a ``/healthz`` probe has gone unanswered for
:data:`STALL_SEC` (well over WatchdogSec), so every run proves the stall, and
then asserts that no ping was sent while the probe waited and that the pings
come back after the lock goes.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import threading
import time

import httpx
import pytest

from tests.daemon import RunningDaemon, daemon_env, free_port
from tests.reliability.kit import TINY, chat_body, import_model, wait_until

pytestmark = pytest.mark.slow
WATCHDOG_SEC = 1.0
STALL_SEC = 2.5 * WATCHDOG_SEC  # how long a probe must go unanswered to prove the stall


class NotifyListener:
    """A datagram socket standing in for systemd's; records (time, message)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def times(self, message: str, since: float = 0.0, until: float = float("inf")) -> list[float]:
        return [t for t, m in list(self.messages) if m == message and since <= t <= until]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _max_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=float("inf"))


def _unanswered_probe(url: str) -> float | None:
    """When a ``/healthz`` probe was sent that the daemon left unanswered for STALL_SEC; None if it answered."""
    sent = time.monotonic()
    try:
        httpx.get(url + "/healthz", timeout=STALL_SEC)
    except httpx.TimeoutException:
        return sent
    return None


def _supervised(tmp_path) -> tuple[NotifyListener, RunningDaemon]:
    """A daemon (not started yet) set up as systemd starts it with WatchdogSec, and the listener on its notify socket."""
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    port = free_port()
    data_dir = tmp_path / "data"
    env = daemon_env(
        data_dir, port, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), WATCHDOG_USEC=str(int(WATCHDOG_SEC * 1_000_000))
    )
    env.pop("WATCHDOG_PID", None)
    return listener, RunningDaemon(data_dir, port, env)


def test_watchdog_pings_while_alive_stop_when_the_daemon_is_stopped_and_resume(tmp_path):
    listener, daemon = _supervised(tmp_path)
    try:
        daemon.start()
        ready = wait_until(lambda: listener.times("READY=1"), 5, 0.05, "READY=1")  # sent just after the admin socket is bound
        assert len(ready) == 1

        time.sleep(3.0)
        alive = listener.times("WATCHDOG=1", since=ready[0])
        assert len(alive) >= 4
        assert _max_gap(alive) < WATCHDOG_SEC  # systemd never sees a late ping

        daemon.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        time.sleep(2.5 * WATCHDOG_SEC)
        resumed_at = time.monotonic()
        daemon.proc.send_signal(signal.SIGCONT)
        during = listener.times("WATCHDOG=1", since=stopped_at + 0.1, until=resumed_at)
        assert during == []  # systemd's WatchdogSec passes without a ping: it would restart the daemon

        time.sleep(2.0)
        after = listener.times("WATCHDOG=1", since=resumed_at)
        assert len(after) >= 2 and after[0] - resumed_at < 1.5 * WATCHDOG_SEC
        assert _max_gap(after) < WATCHDOG_SEC
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGCONT)
        code = daemon.stop()
        listener.close()
    assert code == 0
    assert listener.times("STOPPING=1")


def test_no_ping_while_the_event_loop_is_stalled(tmp_path, tiny_gguf):
    listener, daemon = _supervised(tmp_path)
    try:
        daemon.start()
        import_model(daemon, tiny_gguf, TINY)
        first, second = daemon.create_key("stall-1"), daemon.create_key("stall-2")
        assert daemon.client(first, timeout=60).post("/v1/chat/completions", json=chat_body()).status_code == 200  # warm
        with daemon.admin() as admin:
            for key in (first, second):  # each change drops the cached limits
                assert admin.put(f"/admin/quotas/key:{key[:12]}", json={"tokens_per_day": 1_000_000}).status_code == 200
        lock = sqlite3.connect(daemon.data_dir / "appliance.db", isolation_level=None, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")  # another writer holds the database
        askers = [
            threading.Thread(target=lambda k=k: daemon.client(k, timeout=60).post("/v1/chat/completions", json=chat_body()))
            for k in (first, second)
        ]
        askers[0].start()  # its reservation now waits in the ledger's writer, on the meter's connection
        time.sleep(1.0)
        askers[1].start()  # its limits are read on the event loop, through that connection
        probe_sent = wait_until(lambda: _unanswered_probe(daemon.url), 6.0, 0.05, "a health probe left unanswered")
        lock.execute("COMMIT")
        lock.close()
        for asker in askers:
            asker.join(60)
        time.sleep(1.5)
        during = listener.times("WATCHDOG=1", since=probe_sent + 0.6, until=probe_sent + STALL_SEC)
        assert during == [], f"pings while the loop could not answer for {STALL_SEC} s"
        assert listener.times("WATCHDOG=1", since=probe_sent + STALL_SEC + 0.5)  # and they came back
    finally:
        daemon.stop()
        listener.close()
