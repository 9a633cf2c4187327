"""A hub pull through the real daemon and the real CLI: a split GGUF from a gated repository is pulled with the
token, served by llama.cpp (which opens the other parts itself), and the token is nowhere to be found."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil

from appliance.store import split_gguf
from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer

TOKEN = "hf_CanaryToken0123456789abcdef"
WRONG = "hf_WrongCanary9876543210fedcba"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=300)


def _argv_of_the_daemon_and_its_children(pid: int) -> str:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return "\n".join(" ".join(p.cmdline()) for p in procs)


def test_a_gated_split_model_is_pulled_served_and_its_token_never_shown(tmp_path: Path) -> None:
    first = make_tiny_gguf(tmp_path / "src" / "Tiny-Q8_0.gguf", vocab=1024, n_embd=128, split_max_tensors=8)
    parts = split_gguf.parts_of(first)
    token_file = tmp_path / "hub-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with RangeServer() as cdn, HubServer(cdn, token=TOKEN) as hub:
        hub.add_repo("org/Tiny-GGUF", {p.name: p for p in parts}, gated=True)
        daemon = start_daemon(
            tmp_path,
            APPLIANCE_HUB_URL=hub.url,
            APPLIANCE_HUB_TOKEN_FILE=str(token_file),
            APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]',
        )
        try:
            pulled = _cli(daemon.env, "models", "pull", "hf:org/Tiny-GGUF:q8_0")
            assert pulled.returncode == 0, pulled.stderr
            assert "tiny:q8_0 from hf:org/Tiny-GGUF/Tiny-Q8_0-00001-of-00003.gguf" in pulled.stdout
            assert "in 3 file(s); Q8_0 as named" in pulled.stdout and "Pulled tiny:q8_0: ready" in pulled.stdout
            with daemon.admin() as admin:
                info = admin.get("/admin/models/tiny:q8_0").json()
            assert info["size_bytes"] == sum(p.stat().st_size for p in parts)
            key = daemon.create_key("hub")
            with daemon.client(key) as client:
                r = client.post("/v1/completions", json={"model": "tiny:q8_0", "prompt": "hello", "max_tokens": 4})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] >= 1
            argv = _argv_of_the_daemon_and_its_children(daemon.proc.pid)  # type: ignore[union-attr]
            assert "tiny-q8_0-00001-of-00003.gguf" in argv or "tiny:q8_0" in argv  # the engine ran the split model

            token_file.write_text(WRONG + "\n")  # read again at the next pull
            with daemon.admin() as admin:
                refused = admin.post("/admin/models/pull", json={"url": "hf:org/Tiny-GGUF"})
            assert refused.status_code == 502 and refused.json()["error"]["code"] == "hub_access_denied"
            assert "not accepted" in refused.json()["error"]["message"]
            bodies = pulled.stdout + pulled.stderr + refused.text
            argv = _argv_of_the_daemon_and_its_children(daemon.proc.pid)  # type: ignore[union-attr]
        finally:
            daemon.stop()
        assert [r for r in hub.requests if r["authorization"] == f"Bearer {TOKEN}"]
        assert all(r["authorization"] is None for r in cdn.requests)  # never forwarded past the redirect
    dump = "\n".join(sqlite3.connect(daemon.data_dir / "appliance.db").iterdump())
    assert "hub_access_denied" in dump or "model.pull" in dump  # the pulls were recorded ...
    for secret in (TOKEN, WRONG, TOKEN[3:], WRONG[3:]):  # ... without the token, anywhere
        assert secret not in daemon.log()
        assert secret not in dump
        assert secret not in argv
        assert secret not in bodies


def _job(admin: object, job_id: int) -> dict:
    return admin.get(f"/admin/jobs/{job_id}").json()  # type: ignore[attr-defined]


def test_a_split_pull_killed_with_the_daemon_resumes_after_a_restart(tmp_path: Path) -> None:
    import time

    first = make_tiny_gguf(tmp_path / "src" / "Big-Q8_0.gguf", vocab=4096, n_embd=128, split_max_tensors=8)
    parts = split_gguf.parts_of(first)
    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo("org/Big-GGUF", {p.name: p for p in parts})
        for served in cdn.files.values():
            served.delay_per_chunk, served.chunk = 0.02, 1 << 14
        daemon = start_daemon(tmp_path, APPLIANCE_HUB_URL=hub.url, APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]')
        try:
            with daemon.admin() as admin:
                started = admin.post("/admin/models/pull", json={"url": "hf:org/Big-GGUF"})
                assert started.status_code == 202, started.text
                job = started.json()
                assert (
                    len(job["hub"]["variants"][0]["files"]) == 3
                    and job["hub"]["files"] == 3
                    and job["hub"]["reason"] == "the only GGUF variant of org/Big-GGUF"
                )
                deadline = time.monotonic() + 120
                while _job(admin, job["id"])["done_bytes"] < parts[0].stat().st_size + (1 << 15):  # into the second part
                    assert time.monotonic() < deadline and _job(admin, job["id"])["state"] == "running"
                    time.sleep(0.05)
            daemon.kill()  # SIGKILL mid-download
            store = daemon.data_dir / "models"
            assert [p.name for p in store.rglob("*.partial")]
            for served in cdn.files.values():
                served.delay_per_chunk = 0
            seen = len(cdn.requests)
            daemon.start()
            with daemon.admin() as admin:
                again = admin.post("/admin/models/pull", json={"url": "hf:org/Big-GGUF"}).json()
                deadline = time.monotonic() + 120
                while (state := _job(admin, again["id"]))["state"] not in ("done", "failed"):
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                assert state["state"] == "done", state
                assert state["total_bytes"] == sum(p.stat().st_size for p in parts)
                info = admin.get("/admin/models/big:q8_0").json()
        finally:
            daemon.stop()
        resumed = [r for r in cdn.requests[seen:] if r["path"].endswith("00002-of-00003.gguf")]
        assert resumed and resumed[0]["range"] is not None  # picked up where the killed daemon stopped
    assert info["status"] == "ready" and not list(store.rglob("*.partial")) and not list(store.rglob("*.partial.json"))
    stored = sorted((store / "big").rglob("*.gguf"))
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in stored] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in parts
    ]
