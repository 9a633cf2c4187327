"""Engine processes: start, watch, restart with backoff, stop.

Each loaded model runs in its own child process (its own process group) that
serves OpenAI-shaped HTTP on a private Unix socket in the run dir. A crash in
native code cannot take the daemon down, and unloading frees the memory for
real. When an engine dies unexpectedly, requests in flight see their
connection drop (the gateway answers 503), and the supervisor restarts it
with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from appliance.drivers import Driver
from appliance.errors import BadRequest, EngineUnavailable
from appliance.planner.types import Plan
from appliance.serving.engine_client import EngineClient, EngineConnectionError
from appliance.settings import Settings

log = logging.getLogger("appliance.serving.engines")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
MAX_RESTARTS_IN_WINDOW = 5
RESTART_WINDOW_S = 300.0
STOP_GRACE_S = 5.0
ENGINE_LOG_LINE_LIMIT = 1 << 20
_PR_SET_PDEATHSIG = 1
#: The engine route of each gateway endpoint (OpenAI's paths; the driver's routes allow them).
ENDPOINT_ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()  # resolved here, so the forked child only calls it


def _die_with_daemon(daemon_pid: int) -> Callable[[], None] | None:
    """A pre-exec hook: the engine gets SIGTERM when the daemon dies, even by SIGKILL.

    Without it an engine outlives a crashed daemon and keeps the model's (GPU)
    memory; the restarted daemon cannot adopt it and would start a second one.
    """
    if _prctl is None:
        return None

    def hook() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != daemon_pid:  # the daemon died before the hook ran
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


@dataclass
class EngineStats:
    restarts: int = 0
    last_exit_code: int | None = None
    last_error: str | None = None
    restart_times: list[float] = field(default_factory=list)


def _pool_size(plan: Plan) -> int:
    return min(int(getattr(plan, "parallel", 8) or 8), 64) + 4


class EngineProcess:
    """One engine child process serving one plan on one Unix socket."""

    def __init__(
        self,
        name: str,
        plan: Plan,
        driver: Driver,
        settings: Settings,
        socket_path: Path,
        on_state: Callable[[EngineProcess], None] | None = None,
    ):
        self.name = name
        self.plan = plan
        self.driver = driver
        self.settings = settings
        self.socket_path = socket_path
        self.state = "stopped"  # loading | ready | restarting | failed | stopped
        self.stats = EngineStats()
        self.started_at: float | None = None
        self.pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task | None = None
        self._stderr_task: asyncio.Task | None = None
        self._stopping = False
        self._on_state = on_state
        self._ready = asyncio.Event()
        # An engine that wants a credential (vLLM's per-instance key) gets it on every request. The
        # admission queue already bounds requests to the engine's slots: the idle list keeps that many.
        self.client = EngineClient(socket_path, driver.client_headers(plan), max_idle=_pool_size(plan))

    def route(self, endpoint: str) -> str:
        """The engine route that serves a gateway endpoint (``chat``, ``completions``, ``embeddings``).

        The driver's ``routes`` are the allow-list: an endpoint outside it is refused.
        """
        path = ENDPOINT_ROUTES[endpoint]
        if path not in self.driver.routes:
            raise BadRequest(f"The model `{self.name}` does not serve {path}.", param="model")
        return path

    def _set_state(self, state: str) -> None:
        self.state = state
        if state == "ready":
            self._ready.set()
        else:
            self._ready.clear()
        if self._on_state:
            self._on_state(self)

    async def start(self) -> None:
        """Start the process and wait until it answers its health route."""
        self._stopping = False
        await self._spawn()
        self._watch = asyncio.create_task(self._watch_loop(), name=f"engine-watch-{self.name}")

    async def _spawn(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        argv = self.driver.command(self.plan, self.socket_path, self.settings)
        env = {**os.environ, **self.driver.environment(self.plan, self.settings)}
        self._set_state("loading")
        log.info("starting engine %s", self.name, extra={"fields": {"backend": self.driver.name, "argv": argv[:3]}})
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
            limit=ENGINE_LOG_LINE_LIMIT,
            preexec_fn=_die_with_daemon(os.getpid()),
        )
        self.pid = self._proc.pid
        self.started_at = time.time()
        self._stderr_task = asyncio.create_task(self._pump_stderr(self._proc))
        try:
            await self._wait_healthy(self.settings.load_timeout_seconds)
        except Exception:
            await self._kill()
            raise
        self._set_state("ready")

    async def _pump_stderr(self, proc: asyncio.subprocess.Process) -> None:
        """Copy the engine's log into the appliance log, keeping the last line for errors."""
        assert proc.stderr is not None
        engine_log = logging.getLogger(f"appliance.engine.{self.driver.name}")
        while True:
            try:
                line = await proc.stderr.readline()
            except ValueError:  # a line past the stream's limit: take what is buffered and go on
                line = await proc.stderr.read(ENGINE_LOG_LINE_LIMIT)
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self.stats.last_error = text[-500:]
                engine_log.info(text, extra={"fields": {"model": self.name}})

    async def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.returncode is not None:
                code = self._proc.returncode if self._proc else None
                if self._stderr_task:
                    await asyncio.wait([self._stderr_task], timeout=1.0)
                raise EngineUnavailable(
                    f"Engine for {self.name} exited during load (code {code}): {self.stats.last_error or 'no output'}"
                )
            if self.socket_path.exists():
                try:
                    async with asyncio.timeout(2.0):
                        status, _ = await self.client.get(self.driver.health_path)
                    if status == 200:
                        return
                except (EngineConnectionError, TimeoutError):
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise EngineUnavailable(f"Engine for {self.name} was not ready within {timeout:.0f} s.")

    async def _watch_loop(self) -> None:
        """Restart the engine with backoff when it dies on its own."""
        backoff = BACKOFF_START_S
        while not self._stopping:
            proc = self._proc
            if proc is None:
                return
            code = await proc.wait()
            if self._stopping:
                return
            self.stats.last_exit_code = code
            now = time.time()
            self.stats.restart_times = [t for t in self.stats.restart_times if now - t < RESTART_WINDOW_S] + [now]
            log.warning("engine %s exited with code %s", self.name, code, extra={"fields": {"model": self.name}})
            if len(self.stats.restart_times) > MAX_RESTARTS_IN_WINDOW:
                self._set_state("failed")
                log.error(
                    "engine %s failed %d times in %d s; not restarting", self.name, MAX_RESTARTS_IN_WINDOW, RESTART_WINDOW_S
                )
                return
            self._set_state("restarting")
            await asyncio.sleep(backoff if self.stats.restarts else 0.0)
            self.stats.restarts += 1
            try:
                await self._spawn()
                backoff = BACKOFF_START_S
            except Exception as exc:  # the next loop turn sees the dead process and backs off
                log.warning("engine %s restart failed: %s", self.name, exc)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def wait_ready(self, timeout: float) -> None:
        if self.state == "ready":
            return
        if self.state in ("failed", "stopped"):
            raise EngineUnavailable(f"Engine for {self.name} is {self.state}.", headers={"Retry-After": "5"})
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise EngineUnavailable(
                f"Engine for {self.name} is restarting; try again shortly.", headers={"Retry-After": "2"}
            ) from None

    async def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def stop(self) -> None:
        """Stop the whole process group and free the socket."""
        self._stopping = True
        await self._kill()
        if self._watch:
            self._watch.cancel()
        if self._stderr_task:
            self._stderr_task.cancel()
        await self.client.aclose()
        self.socket_path.unlink(missing_ok=True)
        self._set_state("stopped")

    def rss_bytes(self) -> int | None:
        """Resident memory of the engine's process tree."""
        if self.pid is None:
            return None
        try:
            import psutil

            root = psutil.Process(self.pid)
            return root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
        except Exception:
            return None
