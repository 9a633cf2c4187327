"""Records every attempt of this Python process (and its children) to reach another host.

Put this folder first on ``PYTHONPATH`` and name a file in ``APPLIANCE_TEST_OUTBOUND_LOG``: an
audit hook (PEP 578) appends one JSON line per ``socket.connect``, ``socket.sendto`` or
``socket.getaddrinfo`` whose address is not loopback or a Unix socket. The offline tests
read the file: empty means the process never tried to go out. Each watched process also
appends its pid and its parent's to ``<log>.watched``, so a test can tell that the watch ran.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys

_LOG = os.environ.get("APPLIANCE_TEST_OUTBOUND_LOG")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "", None}


def _is_local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _hook(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.sendto"):
        address = args[1] if event == "socket.connect" else args[-1]
        host = address[0] if isinstance(address, tuple) and address else None
        if host is None:  # a Unix socket (a path) is this machine
            return
    elif event == "socket.getaddrinfo":
        host = args[0]
    else:
        return
    if not _is_local(host):
        with open(_LOG, "a") as out:  # type: ignore[arg-type]
            out.write(json.dumps({"event": event, "host": str(host), "pid": os.getpid()}) + "\n")


if _LOG:
    sys.addaudithook(_hook)
    with open(_LOG + ".watched", "a") as watched:  # which processes the watch covered
        watched.write(json.dumps({"pid": os.getpid(), "parent": os.getppid()}) + "\n")
