"""Start the real daemon as a subprocess on a free port with its own data dir."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningDaemon:
    def __init__(self, data_dir: Path, port: int, env: dict[str, str]):
        self.data_dir = data_dir
        self.port = port
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = data_dir.parent / f"daemon-{port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def admin_socket(self) -> Path:
        return self.data_dir / "run" / "admin.sock"

    def start(self, timeout: float = 120.0) -> Self:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.daemon"], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if self.ready():
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"daemon not ready within {timeout} s:\n{self.log()[-3000:]}")

    @property
    def verify(self) -> str | bool:
        """What clients verify the listener's certificate against (plain HTTP here: nothing)."""
        return True

    def ready(self) -> bool:
        # /readyz can answer before the admin socket is bound: wait for both.
        return httpx.get(self.url + "/readyz", timeout=1.0, verify=self.verify).status_code == 200 and self.admin_socket.exists()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.admin_socket)), base_url="http://appliance", timeout=timeout
        )

    def create_key(self, name: str = "test", **fields: object) -> str:
        with self.admin() as client:
            response = client.post("/admin/keys/", json={"name": name, **fields})
            response.raise_for_status()
            return response.json()["secret"]

    def client(self, key: str, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout, verify=self.verify)

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL the daemon and its engines (its whole session)."""
        if self.proc is None:
            return
        for pid in _descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def daemon_env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env.update(
        APPLIANCE_DATA_DIR=str(data_dir),
        APPLIANCE_PORT=str(port),
        APPLIANCE_HOST="127.0.0.1",
        APPLIANCE_LOG_FORMAT="json",
        APPLIANCE_ENGINE_CONTEXT="2048",
        APPLIANCE_ENGINE_PARALLEL="4",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start_daemon(base: Path, **extra: str) -> RunningDaemon:
    port = free_port()
    data_dir = base / f"data-{port}"
    return RunningDaemon(data_dir, port, daemon_env(data_dir, port, **extra)).start()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    """One real daemon shared by the integration tests that do not stop it."""
    running = start_daemon(tmp_path_factory.mktemp("daemon"))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def api_key(daemon: RunningDaemon) -> str:
    return daemon.create_key("integration")


@pytest.fixture(scope="session")
def admin_key(daemon: RunningDaemon) -> str:
    return daemon.create_key("integration-admin", role="admin")
