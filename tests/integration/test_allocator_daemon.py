"""The real daemon runs on jemalloc (re-executed once, same PID); its engines and a `system` daemon do not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from appliance.allocator import LIBRARY, SAVED_PRELOAD, find_jemalloc
from tests.daemon import daemon_env, free_port, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import TINY, engine_pid, import_model, load, wait_until


def mapped(pid: int) -> bool:
    return LIBRARY in Path(f"/proc/{pid}/maps").read_text()


def environment(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def thread_names(pid: int) -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()]


def test_the_daemon_runs_on_jemalloc_and_its_engines_on_the_system_allocator(tmp_path: Path) -> None:
    assert find_jemalloc() is not None, f"{LIBRARY} is not installed (Debian/Ubuntu: apt-get install libjemalloc2; test.sh does)"
    daemon = start_daemon(tmp_path)
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid  # the re-exec keeps the PID systemd and this test started
        assert mapped(pid) and SAVED_PRELOAD in environment(pid)  # its environment as the re-exec set it
        # jemalloc's background thread, which returns the pages idle threads freed, runs in the daemon.
        assert "jemalloc_bg_thd" in thread_names(pid), thread_names(pid)
        assert "C allocator: jemalloc" in daemon.log()
        import_model(daemon, make_tiny_gguf(tmp_path / "tiny.gguf"), TINY)
        load(daemon)
        engine = engine_pid(daemon)
        engine_env = environment(engine)  # LD_PRELOAD put back as it was (unset) before the engine started
        assert not mapped(engine) and "LD_PRELOAD" not in engine_env and SAVED_PRELOAD not in engine_env
        assert "MALLOC_CONF" not in engine_env
        with daemon.client(daemon.create_key()) as client:
            answer = client.post(
                "/v1/chat/completions", json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            )
        assert answer.status_code == 200, answer.text
    finally:
        daemon.stop()


def test_allocator_system_keeps_glibc(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, APPLIANCE_ALLOCATOR="system")
    try:
        assert daemon.proc is not None and not mapped(daemon.proc.pid)
        assert "C allocator: system" in daemon.log()
    finally:
        daemon.stop()


def test_settings_given_on_the_command_line_survive_the_re_exec(tmp_path: Path) -> None:
    port, other = free_port(), free_port()
    env = daemon_env(tmp_path / "data", other)  # the environment says one port, the command line another
    log = (tmp_path / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "appliance.daemon", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ready = wait_until(lambda: _ready(port) or proc.poll() is not None, 120, 0.2, "the daemon on its --port")
        assert ready is True and proc.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
        assert mapped(proc.pid) and not _ready(other)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
