"""reliability-table row 15: interrupted or corrupted downloads, and a full disk.

* kill -9 of the pulling process mid-download, then pull again: it resumes with
  Range, the hash matches, no ``.partial`` is left;
* a flipped byte: verify marks the variant corrupt and it is never resolved (so
  never loaded);
* ENOSPC: a clear InsufficientStorage error at once, no retry loop, the partial
  file removed and the database still writable. Shown on a real 8 MiB tmpfs when
  the tests run as root (mount allowed), and always with a write that raises
  OSError(ENOSPC).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance.db import engine as dbmod
from appliance.db.tables import AuditLog
from appliance.errors import InsufficientStorage
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelCorrupt, ModelNotReady, ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import RangeServer, make_store, random_file, sha256_file

ALLOW = ["127.0.0.1"]


def partials(store: ModelStore) -> list[Path]:
    return [p for p in store.settings.store_dir.rglob("*") if ".partial" in p.name]


def db_writable(store: ModelStore) -> bool:
    with dbmod.session(store.db) as s:
        s.add(AuditLog(actor="test", action="probe"))
        s.commit()
    return True


def big_gguf(tmp_path: Path, size: int) -> Path:
    """A GGUF header followed by random bytes: inspects fine, and is big enough to interrupt."""
    head = make_tiny_gguf(tmp_path / "head.gguf").read_bytes()
    path = random_file(tmp_path / "big.gguf", size, seed=9)
    with path.open("r+b") as f:
        f.write(head)
    return path


def test_kill_9_mid_download_then_resume(tmp_path: Path) -> None:
    src = big_gguf(tmp_path, 24 << 20)
    size = src.stat().st_size
    data_dir = tmp_path / "data"
    store = make_store(data_dir, allow_private_pull_hosts=ALLOW)
    with RangeServer() as server:
        url = server.add("big.gguf", src, delay_per_chunk=0.01, chunk=1 << 16)  # ~6 MB/s: time to kill it
        script = textwrap.dedent(f"""
            from pathlib import Path
            from tests.storekit import make_store
            store = make_store(Path({str(data_dir)!r}), migrate=False, allow_private_pull_hosts={ALLOW!r})
            store.pull({url!r}, name="big:f32")
        """)
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
        partial = store.settings.store_dir / "big" / "f32" / "big-f32.gguf.partial"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < size // 3):
            assert proc.poll() is None, "the pulling process ended early"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kept = partial.stat().st_size
        assert 0 < kept < size
        assert store.get("big:f32").status == "downloading"
        with pytest.raises(ModelNotReady):
            store.resolve("big:f32")  # a half-downloaded model is never loaded
        server.files["big.gguf"].delay_per_chunk = 0
        info = store.pull(url, name="big:f32")
        resumed = server.requests[-1]
    assert resumed["range"] is not None and int(resumed["range"].removeprefix("bytes=").rstrip("-")) >= kept - (1 << 20)
    assert resumed["if_range"] == '"v1"'
    assert info.status == "ready" and info.sha256 == sha256_file(src) and info.size_bytes == size
    assert partials(store) == []


def test_flipped_byte_is_marked_corrupt_and_never_resolved(tmp_path: Path) -> None:
    src = make_tiny_gguf(tmp_path / "src.gguf")
    store = make_store(tmp_path / "data", allow_private_pull_hosts=ALLOW)
    with RangeServer() as server:
        info = store.pull(server.add("m.gguf", src), name="m:f32", sha256=sha256_file(src))
    path = store.settings.store_dir / info.path
    with path.open("r+b") as f:
        f.seek(path.stat().st_size - 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x80]))
    assert store.resolve("m:f32").name == "m:f32"  # same size: only a re-hash can tell
    assert store.verify("m:f32").status == "corrupt"
    for name in ("m:f32", "m"):
        with pytest.raises(ModelCorrupt):
            store.resolve(name)
    assert store.get("m:f32").status == "corrupt"


class _FullDisk:
    """A file object whose writes fail with ENOSPC after ``limit`` bytes."""

    def __init__(self, real, limit: int):
        self._real, self._left = real, limit

    def write(self, data: bytes) -> int:
        if len(data) > self._left:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._left -= len(data)
        return self._real.write(data)

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


def test_enospc_while_writing_is_clear_final_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated with a write that raises OSError(ENOSPC) (works without root)."""
    src = big_gguf(tmp_path, 4 << 20)
    store = make_store(tmp_path / "data", allow_private_pull_hosts=ALLOW)
    real_open = Path.open

    def fake_open(self: Path, mode: str = "r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        return _FullDisk(f, 1 << 20) if self.name.endswith(".partial") and "b" in mode and mode != "rb" else f

    monkeypatch.setattr(Path, "open", fake_open)
    registry = JobRegistry()
    with RangeServer() as server:
        url = server.add("big.gguf", src)
        started = time.monotonic()
        job = registry.submit("pull", "big:f32", lambda ctx: store.pull(url, name="big:f32", ctx=ctx).to_dict())
        job.wait(30)
        elapsed = time.monotonic() - started
        requests = len(server.requests)
    assert job.state == "failed" and job.error["code"] == "insufficient_storage" and job.error["status"] == 507
    assert "disk is full" in job.message
    assert requests == 1 and elapsed < 5  # no retry loop
    assert partials(store) == [] and store.list() == []
    assert db_writable(store)


@pytest.fixture()
def tiny_disk(tmp_path: Path):
    """An 8 MiB tmpfs as the whole data dir (database included); skipped where mounting is not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the ENOSPC monkeypatch test covers this path")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_real_enospc_on_a_full_tmpfs(tiny_disk: Path, tmp_path: Path) -> None:
    src = big_gguf(tmp_path, 20 << 20)
    store = make_store(tiny_disk / "data", allow_private_pull_hosts=ALLOW)
    free_before = os.statvfs(tiny_disk).f_bavail
    with RangeServer() as server:
        url = server.add("big.gguf", src, no_length=True)  # no Content-Length: the disk fills up mid-write
        with pytest.raises(InsufficientStorage, match="disk is full"):
            store.pull(url, name="big:f32")
        assert len(server.requests) == 1
        assert partials(store) == [] and store.list() == []
        assert os.statvfs(tiny_disk).f_bavail >= free_before - 64  # the space came back
        assert db_writable(store)
        # With a Content-Length, the pull is refused before the first byte is written.
        server.files["big.gguf"].no_length = False
        with pytest.raises(InsufficientStorage, match="needs 20.0 MiB"):
            store.pull(url, name="big:f32")
        assert partials(store) == [] and db_writable(store)
