"""The shipped monitoring files: Prometheus's own promtool accepts the alert rules and the exported scrape
configuration, and refuses the configuration while the metrics key it names is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from appliance.errors import BadRequest
from appliance.monitoring.export import CA_FILE, DASHBOARD, KEY_FILE, PROMETHEUS, RULES, Target, export, shipped
from appliance.tls.generate import TlsFiles, ensure_self_signed

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"  # Debian's prometheus package (test.sh installs it)


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    files = TlsFiles.of(tmp_path / "box")
    ensure_self_signed(files, ["localhost", "127.0.0.1"])
    return files.ca_cert


def test_promtool_accepts_the_shipped_rules(tmp_path: Path):
    (tmp_path / RULES).write_text(shipped(RULES))
    result = promtool("check", "rules", str(tmp_path / RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    names = [r["alert"] for g in yaml.safe_load(shipped(RULES))["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(names)} rules found" in result.stdout
    for wanted in ("ApplianceDown", "ApplianceEngineDown", "ApplianceQueueSaturated", "ApplianceTTFTTargetMissed",
                   "ApplianceBudgetNearLimit", "ApplianceCertificateExpiresSoon", "ApplianceDiskAlmostFull"):  # fmt: skip
        assert wanted in names


def test_promtool_refuses_a_broken_rule(tmp_path: Path):
    """The check above can fail: one unbalanced parenthesis in the shipped rules is reported."""
    broken = shipped(RULES).replace('up{job="appliance"} == 0', 'up{job="appliance"} == (0', 1)
    assert broken != shipped(RULES)
    (tmp_path / RULES).write_text(broken)
    assert promtool("check", "rules", str(tmp_path / RULES)).returncode != 0


def test_promtool_accepts_the_shipped_config_beside_its_files(tmp_path: Path, ca: Path):
    for name in (PROMETHEUS, RULES):
        (tmp_path / name).write_text(shipped(name))
    shutil.copyfile(ca, tmp_path / CA_FILE)
    (tmp_path / KEY_FILE).write_text("ak_placeholder\n")
    result = promtool("check", "config", PROMETHEUS, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(g["rules"]) for g in yaml.safe_load(shipped(RULES))["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("url", "scheme", "address"),
    [
        ("https://llm.example.com:8443", "https", "llm.example.com:8443"),
        ("https://LLM.Example.com", "https", "llm.example.com:443"),
        ("http://10.0.0.7:8080/", "http", "10.0.0.7:8080"),
        ("https://[fd00::7]:9443", "https", "[fd00::7]:9443"),
        ("box.internal:8080", "http", "box.internal:8080"),
    ],
)
def test_export_writes_a_config_promtool_accepts(tmp_path: Path, ca: Path, url: str, scheme: str, address: str):
    dest = tmp_path / "out" / "prometheus"
    written = export(dest, Target.of(url, ca), scrape_interval="5s", key="ak_" + "x" * 40)
    names = {p.name for p in written}
    assert {PROMETHEUS, RULES, DASHBOARD, KEY_FILE} <= names
    assert (dest / KEY_FILE).stat().st_mode & 0o777 == 0o600
    config = yaml.safe_load((dest / PROMETHEUS).read_text())
    job = config["scrape_configs"][0]
    assert job["scheme"] == scheme
    assert job["static_configs"][0]["targets"] == [address]
    assert job["authorization"]["credentials_file"] == KEY_FILE
    assert config["global"]["scrape_interval"] == "5s"
    assert ("tls_config" in job) == (scheme == "https")
    assert (CA_FILE in names) == (scheme == "https")
    assert (dest / PROMETHEUS).read_text().startswith("# Prometheus scrape configuration")  # the comment header is kept
    result = promtool("check", "config", PROMETHEUS, cwd=dest)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_refuses_the_export_without_its_key(tmp_path: Path, ca: Path):
    export(tmp_path, Target.of("https://localhost:8443", ca))
    assert not (tmp_path / KEY_FILE).exists()
    result = promtool("check", "config", PROMETHEUS, cwd=tmp_path)
    assert result.returncode != 0
    assert KEY_FILE in result.stdout + result.stderr


@pytest.mark.parametrize(
    "url", ["ftp://box:21", "https://", "https://box:8443/metrics", "https://box:8443/?x=1", "file:///etc/passwd"]
)
def test_export_refuses_urls_that_are_not_the_box(url: str):
    with pytest.raises(BadRequest):
        Target.of(url)


def test_dashboard_is_grafana_json_over_appliance_metrics():
    dashboard = json.loads(shipped(DASHBOARD))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    assert all("appliance_" in e or e.startswith("up{") for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "instance"}


@pytest.mark.parametrize("target", [0.75, 2.0, 12.5])
def test_export_writes_the_box_ttft_target_into_its_rule(tmp_path: Path, target: float):
    export(tmp_path, Target.of("http://box:8080"), ttft_target_s=target)
    rules = {r["alert"]: r for g in yaml.safe_load((tmp_path / RULES).read_text())["groups"] for r in g["rules"]}
    rule = rules["ApplianceTTFTTargetMissed"]
    assert rule["expr"].rstrip().endswith(f"> {target:g}")
    assert f"above {target:g} s" in rule["annotations"]["summary"]
    others = {name: r for name, r in rules.items() if name != "ApplianceTTFTTargetMissed"}
    shipped_rules = {r["alert"]: r for g in yaml.safe_load(shipped(RULES))["groups"] for r in g["rules"]}
    assert others == {name: r for name, r in shipped_rules.items() if name != "ApplianceTTFTTargetMissed"}
    result = promtool("check", "rules", str(tmp_path / RULES))
    assert result.returncode == 0, result.stdout + result.stderr
