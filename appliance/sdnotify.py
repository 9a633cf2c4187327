"""systemd notification: READY=1, STOPPING=1 and watchdog pings.

The watchdog task pings only after proving liveness: it runs on the event loop
(so a stopped loop stops the pings) and checks the database with a bounded
query in a worker thread. systemd restarts the service when pings stop for
``WatchdogSec``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger("appliance.sdnotify")


def notify(message: str, socket_path: str | None = None) -> bool:
    """Send one sd_notify message; False when not running under systemd."""
    path = socket_path or os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError as exc:
            log.warning("sd_notify failed: %s", exc)
            return False
    return True


def watchdog_interval() -> float | None:
    """Half of WatchdogSec, if systemd asked this process for pings."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return max(0.5, int(usec) / 2_000_000)
    except ValueError:
        return None


async def watchdog_loop(
    interval: float, health_check: Callable[[], None], send: Callable[[str], bool] = notify, check_timeout: float | None = None
) -> None:
    """Ping WATCHDOG=1 every ``interval`` while the loop runs and ``health_check`` passes."""
    timeout = check_timeout or interval
    while True:
        try:
            await asyncio.wait_for(asyncio.to_thread(health_check), timeout)
        except Exception as exc:
            log.error("watchdog health check failed; withholding ping: %s", exc)
        else:
            send("WATCHDOG=1")
        await asyncio.sleep(interval)
