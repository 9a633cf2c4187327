"""The worker's listening side: a mode-0600 Unix socket (never TCP) and a uvicorn server that leaves signals to us."""

from __future__ import annotations

import contextlib
import os
import socket
import stat


def bind_unix(path: str) -> socket.socket:
    if os.path.exists(path) or os.path.islink(path):
        if not _is_socket(path):
            raise SystemExit(f"llamacpp_worker: {path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(256)
    sock.setblocking(False)
    return sock


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after serving, killing the process before
        cleanup; we own the signals instead and exit through ``request_exit``."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

        def request_exit(self) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return Server


def unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
