"""Monitoring through the real daemon (``tls = "self-signed"`` on 127.0.0.1, a tiny llama.cpp model):

- a metrics-role key, made with ``appliancectl keys create NAME --role metrics``, reads /metrics and gets 403 on
  every other route that takes a credential (routes taken from the app itself), the console included;
- Debian's real Prometheus, given the files ``appliancectl monitoring export`` writes, scrapes the daemon over
  HTTPS with that key, and its query API returns the request and token counters after a chat; the shipped alert
  rules evaluate without error and every dashboard query runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from appliance.api.access import ACCESS, Access
from appliance.app import create_app
from appliance.monitoring.export import DASHBOARD, KEY_FILE, RULES, shipped
from appliance.settings import Settings
from tests.daemon import free_port
from tests.tlskit import TINY, TlsDaemon, start_tls_daemon

pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"  # Debian's prometheus package (test.sh installs it)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory):
    running = start_tls_daemon(tmp_path_factory.mktemp("monitoring"))
    try:
        yield running
    finally:
        running.stop()


def ctl(box: TlsDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    """appliancectl as an admin on the box runs it: the daemon's settings in the environment."""
    environ = {k: v for k, v in box.env.items() if k.startswith("APPLIANCE_") or k in ("PATH", "HOME", "LANG")}
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args], env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def metrics_key(box: TlsDaemon) -> str:
    result = ctl(box, "keys", "create", "prom", "--role", "metrics")
    assert result.returncode == 0, result.stderr
    assert "role metrics" in result.stdout
    return result.stdout.strip().splitlines()[-1]


def keyed_routes() -> list[tuple[str, str, Access]]:
    """Every (method, path, level) the app serves behind a credential (not the open probes and assets)."""
    app = create_app(Settings(data_dir="/nonexistent-appliance-routes", seed_default_model=False))
    found = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            level = handler.opt.get(ACCESS)
            if level is Access.PUBLIC:
                continue
            path = re.sub(r"\{[^}]+\}", "x", re.sub(r"\{[^}:]+:int\}", "1", route.path))
            found += [(m, path, level) for m in sorted(set(handler.http_methods) - {"OPTIONS", "HEAD"})]
    return found


def test_metrics_key_reads_metrics(box: TlsDaemon, metrics_key: str):
    for headers in (
        {"Authorization": f"Bearer {metrics_key}"},
        {"authorization": f"bearer {metrics_key}"},
        {"X-Api-Key": metrics_key},
    ):
        response = httpx.get(box.url + "/metrics", headers=headers, verify=str(box.ca), timeout=30)
        assert response.status_code == 200, (headers.keys(), response.text[:300])
        assert "# TYPE appliance_requests_total counter" in response.text


def test_metrics_key_gets_403_everywhere_else(box: TlsDaemon, metrics_key: str):
    routes = keyed_routes()
    paths = {p.rstrip("/") for _, p, _ in routes}
    assert {"/v1/chat/completions", "/v1/models", "/admin/keys", "/metrics", "/api/chat", "/v1/messages"} <= paths
    assert any(level is Access.CONSOLE for _, _, level in routes)
    failures = []
    with box.client(metrics_key, timeout=60) as client:
        for method, path, level in routes:
            if level is Access.METRICS:
                continue
            body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} if method != "GET" else None
            response = client.request(method, path, json=body)
            if response.status_code != 403:
                failures.append((method, path, response.status_code))
        # The console's home page and other spellings of a chat, a model list and an admin route, named by hand.
        for method, path in (("GET", "/"), ("POST", "/v1/chat/completions/"), ("GET", "/v1/models/"), ("GET", "/admin/keys")):
            response = client.request(method, path, json={"model": TINY} if method == "POST" else None)
            if response.status_code != 403:
                failures.append((method, path, response.status_code))
    assert not failures


def test_metrics_key_is_refused_with_a_reason_on_a_chat(box: TlsDaemon, metrics_key: str):
    with box.client(metrics_key) as client:
        response = client.post("/v1/chat/completions", json={"model": TINY, "messages": [{"role": "user", "content": "x"}]})
        models = client.get("/v1/models")
        admin = client.post("/admin/keys/", json={"name": "escalate", "role": "admin"})
    assert response.status_code == 403
    assert "metrics" in response.json()["error"]["message"]
    assert models.status_code == 403
    assert admin.status_code == 403


def _query(prom: str, expr: str) -> list[dict]:
    response = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_for(what: str, check, timeout: float = 90.0, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"prometheus exited {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}")
        try:
            last = check()
            if last:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} not seen within {timeout} s (last: {last!r})")


def test_real_prometheus_scrapes_the_box(box: TlsDaemon, tmp_path: Path):
    dest = tmp_path / "prometheus"
    exported = ctl(box, "monitoring", "export", str(dest), "--create-key", "prometheus", "--scrape-interval", "1s")
    assert exported.returncode == 0, exported.stderr
    assert (dest / KEY_FILE).read_text().startswith("ak_")
    assert f"https://127.0.0.1:{box.port}/metrics" in exported.stdout

    port = free_port()
    prom = f"http://127.0.0.1:{port}"
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={dest / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for("prometheus ready", lambda: httpx.get(prom + "/-/ready", timeout=2).status_code == 200, proc=proc, log=log)
        up = _wait_for(
            "up == 1", lambda: [r for r in _query(prom, 'up{job="appliance"}') if r["value"][1] == "1"], proc=proc, log=log
        )
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{box.port}"

        with box.client(box.create_key("monitoring-chat")) as client:
            chat = client.post(
                "/v1/chat/completions",
                json={"model": TINY, "messages": [{"role": "user", "content": "count me"}], "max_tokens": 4},
            )
        assert chat.status_code == 200, chat.text
        usage = chat.json()["usage"]

        requests = _wait_for(
            "appliance_requests_total",
            lambda: _query(prom, f'appliance_requests_total{{model="{TINY}",status="200"}}'),
            proc=proc,
            log=log,
        )
        assert float(requests[0]["value"][1]) >= 1
        tokens = _wait_for(
            "appliance_tokens_total",
            lambda: {
                r["metric"]["kind"]: float(r["value"][1]) for r in _query(prom, f'appliance_tokens_total{{model="{TINY}"}}')
            },
            proc=proc,
            log=log,
        )
        assert tokens["prompt"] >= usage["prompt_tokens"] > 0
        assert tokens["completion"] >= usage["completion_tokens"] > 0
        expiry = _query(prom, "appliance_tls_certificate_expiry_seconds - time()")
        assert 0 < float(expiry[0]["value"][1]) < 5 * 366 * 86400
        assert float(_query(prom, "appliance_data_dir_free_bytes")[0]["value"][1]) > 0

        # The shipped rules are loaded and evaluate without error.
        def rules_ok():
            groups = httpx.get(prom + "/api/v1/rules", timeout=5).json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return rules if rules and all(r.get("health") == "ok" for r in rules) else None

        rules = _wait_for("rules evaluated", rules_ok, proc=proc, log=log)
        assert len(rules) == sum(1 for line in shipped(RULES).splitlines() if line.strip().startswith("- alert:"))
        firing = {r["name"] for r in rules if r["state"] == "firing"}
        assert not firing & {"ApplianceDown", "ApplianceCertificateExpired", "ApplianceDiskFull"}

        # Every dashboard query runs against the real server.
        dashboard = json.loads(shipped(DASHBOARD))
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                _query(prom, target["expr"].replace("$instance", ".*"))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_rules_and_dashboard_name_only_exported_metrics(box: TlsDaemon, metrics_key: str):
    """Every appliance_* series the shipped rules and dashboard read is one the daemon exports (GPU gauges aside:
    a box without an accelerator has none)."""
    exposition = httpx.get(box.url + "/metrics", headers={"Authorization": f"Bearer {metrics_key}"}, verify=str(box.ca)).text
    exported = set(re.findall(r"^# TYPE (appliance_\w+) ", exposition, re.M))
    wanted = set(re.findall(r"appliance_\w+", shipped(RULES) + shipped(DASHBOARD)))
    wanted = {re.sub(r"_(bucket|sum|count)$", "", n) for n in wanted if not n.startswith("appliance_gpu_")}
    wanted.discard("appliance_")
    assert wanted - exported == set()


def test_budget_use_is_a_gauge(box: TlsDaemon, metrics_key: str):
    """A key with a daily token budget of 400 that spends a chat's tokens: its budget_used_ratio is what it spent / 400,
    and a key with the same budget that spent nothing stands at 0."""
    with box.admin() as admin:
        created = admin.post("/admin/keys/", json={"name": "budgeted"}).json()
        idle = admin.post("/admin/keys/", json={"name": "budgeted-idle"}).json()
    for key in (created, idle):
        result = ctl(box, "quota", "set", key["prefix"], "--tokens-per-day", "400")
        assert result.returncode == 0, result.stderr
    with box.client(created["secret"]) as client:
        chat = client.post(
            "/v1/chat/completions", json={"model": TINY, "messages": [{"role": "user", "content": "spend"}], "max_tokens": 5}
        )
    assert chat.status_code == 200, chat.text
    spent = chat.json()["usage"]["total_tokens"]
    exposition = httpx.get(box.url + "/metrics", headers={"Authorization": f"Bearer {metrics_key}"}, verify=str(box.ca)).text
    series = dict(
        re.findall(
            r'^appliance_budget_used_ratio\{subject="key",subject_id="(\d+)",dimension="tokens_per_day"\} (\S+)$',
            exposition,
            re.M,
        )
    )
    assert float(series[str(created["id"])]) == pytest.approx(spent / 400)
    assert float(series.get(str(idle["id"]), 0)) == 0
