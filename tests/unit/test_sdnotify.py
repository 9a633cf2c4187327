"""sd_notify over a real datagram socket, and the watchdog's refusal to ping a stuck loop."""

import asyncio
import socket
import threading
import time

import pytest

from appliance.sdnotify import notify, watchdog_interval, watchdog_loop


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield path, sock
    sock.close()


def test_notify_sends_datagram(notify_socket):
    path, sock = notify_socket
    assert notify("READY=1", str(path))
    assert sock.recv(100) == b"READY=1"


def test_notify_without_systemd_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert watchdog_interval() is None


def test_watchdog_pings_while_loop_and_db_are_alive_and_stops_when_loop_stalls(notify_socket):
    path, sock = notify_socket
    pings: list[float] = []

    def send(message: str) -> bool:
        pings.append(time.monotonic())
        return notify(message, str(path))

    async def scenario():
        task = asyncio.create_task(watchdog_loop(0.05, lambda: None, send=send))
        await asyncio.sleep(0.3)
        before_stall = len(pings)
        time.sleep(0.5)  # the event loop is blocked: no ping may be sent meanwhile
        stalled = len(pings)
        task.cancel()
        return before_stall, stalled

    before_stall, stalled = asyncio.run(scenario())
    assert before_stall >= 3
    assert stalled - before_stall <= 1  # at most the ping already in flight
    assert sock.recv(100) == b"WATCHDOG=1"


def test_watchdog_withholds_ping_when_database_check_fails():
    pings: list[str] = []

    def broken_db() -> None:
        raise OSError("database is locked")

    async def scenario():
        task = asyncio.create_task(watchdog_loop(0.02, broken_db, send=lambda m: pings.append(m) or True))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(scenario())
    assert pings == []


def test_watchdog_withholds_ping_when_database_check_hangs():
    pings: list[str] = []
    release = threading.Event()

    async def scenario():
        task = asyncio.create_task(
            watchdog_loop(0.05, lambda: release.wait(5), send=lambda m: pings.append(m) or True, check_timeout=0.05)
        )
        await asyncio.sleep(0.3)
        task.cancel()
        release.set()

    asyncio.run(scenario())
    assert pings == []
