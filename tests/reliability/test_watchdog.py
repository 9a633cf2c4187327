"""The systemd watchdog, daemon-level (SECURITY-TESTS row 18; the loop itself: tests/unit/test_sdnotify.py).

The daemon runs as systemd would start it with ``WatchdogSec=1``: a
``NOTIFY_SOCKET`` (a datagram socket this test binds) and ``WATCHDOG_USEC``.
What must hold: ``READY=1`` arrives once the daemon serves; ``WATCHDOG=1``
pings keep coming, never further apart than WatchdogSec; when the daemon is
stopped (SIGSTOP: its event loop cannot run) the pings stop, so systemd would
kill and restart it after WatchdogSec; after SIGCONT they resume; SIGTERM
sends ``STOPPING=1``.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from tests.daemon import RunningDaemon, daemon_env, free_port

pytestmark = pytest.mark.slow
WATCHDOG_SEC = 1.0


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
            except socket.timeout:
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
    return max((b - a for a, b in zip(times, times[1:])), default=float("inf"))


def test_watchdog_pings_while_alive_stop_when_the_daemon_is_stopped_and_resume(tmp_path):
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    port = free_port()
    data_dir = tmp_path / "data"
    env = daemon_env(data_dir, port, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), WATCHDOG_USEC=str(int(WATCHDOG_SEC * 1_000_000)))
    env.pop("WATCHDOG_PID", None)
    daemon = RunningDaemon(data_dir, port, env)
    try:
        daemon.start()
        ready = listener.times("READY=1")
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

