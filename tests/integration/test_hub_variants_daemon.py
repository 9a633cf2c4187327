"""Available variants through the real daemon, the real CLI and the console: a pull from a mirror without the tree
endpoint registers the repository's other quantizations; they are listed with their state, size and fit, are not
in /v1/models and cannot serve until pulled; pulling one by name (CLI, Ollama API, console) downloads it and llama.cpp
serves it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import ollama

from appliance.accounts.users import create_user
from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.services import Services
from appliance.settings import Settings
from appliance.store import split_gguf
from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer
from tests.unit.test_webui_app import _csrf, signed_in

REPO = "org/Tiny-GGUF"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=300)


def _repo(folder: Path) -> dict[str, Path]:
    first = make_tiny_gguf(folder / "split" / "Tiny-Q4_0.gguf", vocab=1024, n_embd=128, seed=4, split_max_tensors=8)
    return {
        "Tiny-Q8_0.gguf": make_tiny_gguf(folder / "q8.gguf", seed=1),
        "Tiny-F16.gguf": make_tiny_gguf(folder / "f16.gguf", vocab=768, seed=2),
        **{p.name: p for p in split_gguf.parts_of(first)},
    }


def _tiny(models: dict[str, list[dict[str, str]]]) -> list[str]:
    return sorted(m["id"] for m in models["data"] if m["id"].startswith("tiny"))


def test_available_variants_are_listed_not_served_and_pulled_by_name(tmp_path: Path) -> None:
    files = _repo(tmp_path / "src")
    with RangeServer() as cdn, HubServer(cdn, tree_status=501, sibling_sizes=False) as mirror:
        mirror.add_repo(REPO, files)
        daemon = start_daemon(tmp_path, APPLIANCE_HUB_URL=mirror.url, APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]')
        try:
            pulled = _cli(daemon.env, "models", "pull", f"hf:{REPO}:q8_0")
            assert pulled.returncode == 0, pulled.stderr
            listed = _cli(daemon.env, "models", "ls", "--json")
            assert listed.returncode == 0, listed.stderr
            rows = {r["name"]: r for r in json.loads(listed.stdout) if r["family"] == "tiny"}  # beside the seeded default
            assert {n: r["status"] for n, r in rows.items()} == {
                "tiny:q8_0": "ready",
                "tiny:f16": "available",
                "tiny:q4_0": "available",
            }
            assert rows["tiny:q4_0"]["size_bytes"] == sum(p.stat().st_size for n, p in files.items() if "-of-" in n)
            assert rows["tiny:f16"]["fit"]["fits"] is True and rows["tiny:f16"]["source"] == f"hf:{REPO}/Tiny-F16.gguf"
            table = _cli({**daemon.env, "COLUMNS": "200"}, "models", "ls")  # wide enough for rich not to wrap
            assert table.returncode == 0 and "available (fits)" in table.stdout and "tiny:f16" in table.stdout

            key = daemon.create_key("variants")
            with daemon.client(key) as client:
                assert _tiny(client.get("/v1/models").json()) == ["tiny:q8_0"]
                refused = client.post("/v1/completions", json={"model": "tiny:f16", "prompt": "hello", "max_tokens": 4})
                assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_downloaded"

            again = _cli(daemon.env, "models", "pull", "tiny:f16")  # an available variant, pulled by its name
            assert again.returncode == 0, again.stderr
            assert f"tiny:f16 from hf:{REPO}/Tiny-F16.gguf" in again.stdout and "Pulled tiny:f16: ready" in again.stdout
            with daemon.client(key) as client:
                assert _tiny(client.get("/v1/models").json()) == ["tiny:f16", "tiny:q8_0"]
                served = client.post("/v1/completions", json={"model": "tiny:f16", "prompt": "hello", "max_tokens": 4})
                assert served.status_code == 200, served.text
                assert served.json()["usage"]["completion_tokens"] >= 1
            with daemon.admin() as admin:
                unloaded = admin.post("/admin/instances/tiny:f16/unload")
                assert unloaded.status_code == 200 and unloaded.json()["unloaded"] is True
            admin = daemon.create_key("ollama-admin", role="admin")
            admin_client = ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {admin}"}, timeout=300)
            assert admin_client.pull("tiny:q4_0").status == "success"  # the split variant, through the Ollama API
            assert "tiny:q4_0" in [m.model for m in admin_client.list().models]
            for name in ("tiny:f16", "tiny:q4_0"):
                removed = _cli(daemon.env, "models", "rm", name, "--yes")
                assert removed.returncode == 0, removed.stderr
            left = json.loads(_cli(daemon.env, "models", "ls", "--json").stdout)
            assert [r["name"] for r in left if r["family"] == "tiny"] == ["tiny:q8_0"]
        finally:
            daemon.stop()
    assert [r for r in mirror.requests if r["method"] == "HEAD"]  # sizes asked of the mirror, which lists no tree


class _Rows(HTMLParser):
    """The installed table's rows: model name -> (status badge, whether it offers a Pull button)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._model: str | None = None
        self._in_status = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-model"):
            self._model = found["data-model"]
            self.rows[self._model] = []
        if tag == "span" and (found.get("class") or "").startswith("badge state-"):
            self._in_status = True

    def handle_data(self, data: str) -> None:
        if self._model is not None and data.strip() and (self._in_status or data.strip() in ("Pull", "Load")):
            self.rows[self._model].append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._in_status = False
        if tag == "table":  # the catalog's table follows, with Pull buttons of its own
            self._model = None


def test_the_console_lists_available_variants_and_pulls_one(tmp_path: Path) -> None:
    files = _repo(tmp_path / "src")
    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo(REPO, files)
        settings = Settings(
            data_dir=tmp_path / "data", seed_default_model=False, hub_url=hub.url, allow_private_pull_hosts=["127.0.0.1"]
        )
        settings.data_dir.mkdir()
        dbmod.migrate(settings.db_path)
        services = Services(settings)
        create_user(services.db, "alice", "alice-password-1", role="admin")
        services.store.pull_hub(services.store.prepare_hub_pull(f"hf:{REPO}:q8_0"))
        client = signed_in(create_app(settings, services=services), "alice")
        try:
            page = client.get("/models").text
            parser = _Rows()
            parser.feed(page)
            assert parser.rows == {
                "tiny:f16": ["available", "Pull"],
                "tiny:q4_0": ["available", "Pull"],
                "tiny:q8_0": ["ready", "Load"],
            }
            assert "on the hub, not downloaded: hf:org/Tiny-GGUF/Tiny-F16.gguf" in page
            response = client.post("/models/pull", data={"name": "tiny:f16"}, headers={"X-CSRF-Token": _csrf(page)})
            assert response.status_code == 200, response.text
            job = next(j for j in services.jobs.list() if j.target == "tiny:f16")
            deadline = time.monotonic() + 60
            while not job.finished:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert job.state == "done", job.message
            assert services.store.get("tiny:f16").status == "ready"
            assert [r["path"] for r in cdn.requests] == [f"/cdn/{REPO}/Tiny-Q8_0.gguf", f"/cdn/{REPO}/Tiny-F16.gguf"]
        finally:
            client.__exit__(None, None, None)
            services.db.dispose()
