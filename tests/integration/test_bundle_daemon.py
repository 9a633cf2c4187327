"""An offline bundle made from one data dir is imported by a daemon set ``offline = true`` through the real CLI,
then serves a request; the same daemon refuses pulls, naming the setting, and exports the model again.

Every socket the daemon, its engine and the CLI open is watched (``tests/outbound_watch``): from
start-up through the scheduler's first rounds, the import, the answer and the refused pulls,
none of them tries to reach another host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from appliance.store.bundles import bundle_stream
from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_store


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=300)


def test_a_bundle_from_another_data_dir_serves_on_an_offline_appliance(tmp_path: Path) -> None:
    source = make_store(tmp_path / "elsewhere")
    made = source.import_path(str(make_tiny_gguf(tmp_path / "tiny-f32.gguf", vocab=1024)), name="tiny:f32")
    manifest, files = source.export_bundle(made.name)
    bundle = tmp_path / "tiny.tar"
    with bundle.open("wb") as out:
        for chunk in bundle_stream(manifest, files):
            out.write(chunk)

    outbound = tmp_path / "outbound.jsonl"
    watch = str(Path(__file__).resolve().parents[1] / "outbound_watch")
    daemon = start_daemon(
        tmp_path,
        APPLIANCE_OFFLINE="true",
        APPLIANCE_TEST_OUTBOUND_LOG=str(outbound),
        PYTHONPATH=os.pathsep.join(filter(None, [watch, os.environ.get("PYTHONPATH")])),
    )
    try:
        imported = _cli(daemon.env, "models", "import", str(bundle))
        assert imported.returncode == 0, imported.stderr
        assert "Imported tiny:f32: ready" in imported.stdout and made.sha256 in imported.stdout
        key = daemon.create_key("bundle")
        with daemon.client(key) as client:
            r = client.post("/v1/completions", json={"model": "tiny:f32", "prompt": "hello", "max_tokens": 4})
            assert r.status_code == 200, r.text
        refused = _cli(daemon.env, "models", "pull", "hf:org/Tiny-GGUF")
        assert refused.returncode != 0 and "offline = true" in refused.stderr
        with daemon.admin() as admin:
            r = admin.post("/admin/models/pull", json={"url": "https://example.com/m.gguf", "name": "m:f32"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "offline"
        again = tmp_path / "again.tar"
        exported = _cli(daemon.env, "models", "export", "tiny:f32", str(again))
        assert exported.returncode == 0, exported.stderr
        assert _cli(daemon.env, "models", "export", "tiny:f32", str(again)).returncode != 0  # never replaces a file
        time.sleep(6)  # the scheduler's 5-second jobs run at least once
        daemon_pid = daemon.proc.pid
    finally:
        daemon.stop()
    watched = [json.loads(line) for line in Path(f"{outbound}.watched").read_text().splitlines()]
    assert daemon_pid in {w["pid"] for w in watched}, watched
    assert any(w["parent"] == daemon_pid for w in watched), watched  # the engine the daemon started, too
    assert not outbound.exists() or outbound.read_text() == "", outbound.read_text()
    with tarfile.open(again) as tar:
        names = tar.getnames()
        shipped = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert names == ["manifest.json", "files/tiny-f32.gguf"]
    assert shipped["files"] == manifest["files"] and shipped["sha256"] == made.sha256
    assert shipped["source"] == f"bundle:{made.source}"
