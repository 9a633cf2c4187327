"""A full disk during a pull, with the whole data dir (database, logs, store) on a 20 MiB tmpfs.

What must hold: the pull job fails at once with a clear 507 ("disk is full"),
the download is not retried in a loop, no ``.partial`` file is left and the
space comes back; the daemon keeps running and everything that writes still
works: the database (a new key, an audit row, a usage row), the log, and
serving the installed model. (Store-level ENOSPC tests: tests/security/test_store_integrity.py.)

Mounting needs root; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.daemon import RunningDaemon, daemon_env, free_port
from tests.reliability.kit import TERMINAL_JOB_STATES, TINY, chat_body, db_rows, wait_until
from tests.storekit import RangeServer, make_store, random_file

pytestmark = pytest.mark.slow
DISK_MIB = 20


@pytest.fixture()
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_full_disk_during_a_pull_fails_cleanly_and_the_daemon_keeps_writing(small_disk, tmp_path, tiny_gguf):
    data_dir = small_disk / "data"
    store = make_store(data_dir)  # the tiny model installed before the daemon starts: no 250 MB default model
    store.import_path(str(tiny_gguf), name=TINY)
    store.db.dispose()
    port = free_port()
    env = daemon_env(
        data_dir,
        port,
        APPLIANCE_SEED_DEFAULT_MODEL="false",
        APPLIANCE_DEFAULT_MODEL=TINY,
        APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]',
    )
    daemon = RunningDaemon(data_dir, port, env)
    daemon.log_path = tmp_path / "daemon.log"  # the daemon's stderr copy stays off the small disk
    source = random_file(tmp_path / "big.gguf", (DISK_MIB + 10) << 20, seed=5)
    with source.open("r+b") as f:
        f.write(tiny_gguf.read_bytes()[:4096])  # a GGUF header: the download is a plausible model
    try:
        daemon.start()
        free_before = _free(small_disk)
        with RangeServer() as server, daemon.admin() as admin:
            url = server.add("big.gguf", source, no_length=True)  # no Content-Length: the disk fills mid-write
            started = time.monotonic()
            response = admin.post("/admin/models/pull", json={"url": url, "name": "big:f32"})
            assert response.status_code == 202, response.text
            job_id = response.json()["id"]
            job = wait_until(
                lambda: (j := admin.get(f"/admin/jobs/{job_id}").json())["state"] in TERMINAL_JOB_STATES and j,
                60,
                0.1,
                "the pull job ending",
            )
            elapsed = time.monotonic() - started
            time.sleep(1.0)  # a retry loop would show up as more requests
            requests = len(server.requests)
        assert job["state"] == "failed", job
        assert job["error"]["code"] == "insufficient_storage" and job["error"]["status"] == 507, job["error"]
        assert "disk is full" in job["message"] and str(data_dir) not in job["message"]
        assert requests == 1 and elapsed < 30
        assert [p for p in data_dir.rglob("*") if ".partial" in p.name] == []
        assert _free(small_disk) >= free_before - (1 << 20)  # the space came back (give or take the log)

        # Everything that writes still works.
        log_path = data_dir / "logs" / "appliance.log"
        log_size = log_path.stat().st_size
        key = daemon.create_key("after-enospc")
        with daemon.client(key) as client:
            chat = client.post("/v1/chat/completions", json=chat_body("still writing?"))
            assert chat.status_code == 200, chat.text
            request_id = chat.headers["x-request-id"]
        assert db_rows(data_dir, "SELECT status FROM usage WHERE request_id = ?", request_id) == [(200,)]
        with daemon.admin() as admin:
            models = {m["name"]: m["status"] for m in admin.get("/admin/models/").json()}
        assert models == {TINY: "ready"}
        assert daemon.proc.poll() is None
        wait_until(lambda: log_path.stat().st_size > log_size, 5, 0.1, "the log growing")  # the engine's load was logged
        assert log_path.read_text().endswith("}\n")  # whole lines
    finally:
        daemon.stop()
