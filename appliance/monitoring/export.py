"""Write the shipped monitoring files for one box: its address, scheme and CA filled into ``prometheus.yml``."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from appliance.errors import BadRequest

PROMETHEUS = "prometheus.yml"
RULES = "alert_rules.yml"
DASHBOARD = "grafana-dashboard.json"
SHIPPED = (PROMETHEUS, RULES, DASHBOARD)
KEY_FILE = "appliance-metrics.key"
CA_FILE = "appliance-ca.crt"
TTFT_RULE = "      - alert: ApplianceTTFTTargetMissed"
SHIPPED_TTFT_TARGET_S = 2.0  # the shipped rule's threshold: latency_targets' default interactive ttft_p95_s
HEADER_END = "global:"  # the shipped file's comment header ends where its YAML begins


@dataclass(frozen=True, slots=True)
class Target:
    """Where Prometheus scrapes the box: ``scheme://host:port``, and the CA file its certificate chains to (https)."""

    scheme: str
    address: str  # host:port
    ca: Path | None = None

    @classmethod
    def of(cls, url: str, ca: Path | None = None) -> Target:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadRequest(f"not an http(s) URL of the appliance: {url!r}", param="url")
        if parts.path not in ("", "/") or parts.query:
            raise BadRequest("the appliance URL takes no path (the metrics path is /metrics)", param="url")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return cls(parts.scheme, f"{host}:{port}", ca if parts.scheme == "https" else None)


def shipped(name: str) -> str:
    """The text of one shipped file."""
    return resources.files("appliance.monitoring").joinpath(name).read_text(encoding="utf-8")


def prometheus_config(target: Target, scrape_interval: str = "15s") -> str:
    """The shipped ``prometheus.yml`` (its comment header kept) for this target."""
    text = shipped(PROMETHEUS)
    header, _, body = text.partition(HEADER_END)
    config = yaml.safe_load(HEADER_END + body)
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["evaluation_interval"] = scrape_interval
    job = config["scrape_configs"][0]
    job["scheme"] = target.scheme
    job["static_configs"] = [{"targets": [target.address], "labels": {"appliance": target.address}}]
    if target.scheme == "https" and target.ca is not None:
        job["tls_config"] = {"ca_file": CA_FILE}
    else:
        job.pop("tls_config", None)  # plain http, or a certificate the Prometheus host already trusts
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def alert_rules(ttft_target_s: float = SHIPPED_TTFT_TARGET_S) -> str:
    """The shipped ``alert_rules.yml`` with the box's interactive TTFT target (seconds) in ApplianceTTFTTargetMissed."""
    text = shipped(RULES)
    start = text.index(TTFT_RULE)
    end = text.index("      - alert:", start + len(TTFT_RULE))
    target = f"{ttft_target_s:g}"
    was = f"{SHIPPED_TTFT_TARGET_S:g}"
    block = text[start:end]
    for old, new in (
        (f")) > {was}\n", f")) > {target}\n"),
        (f"above {was} s", f"above {target} s"),
        (f"target {was} s", f"target {target} s"),
    ):
        if old not in block:
            raise AssertionError(f"the shipped TTFT rule lost {old!r}")
        block = block.replace(old, new)
    return text[:start] + block + text[end:]


def export(
    dest: Path,
    target: Target,
    *,
    scrape_interval: str = "15s",
    key: str | None = None,
    ttft_target_s: float = SHIPPED_TTFT_TARGET_S,
) -> list[Path]:
    """Write prometheus.yml, alert_rules.yml and grafana-dashboard.json into ``dest`` (made if absent), the CA when the
    target has one, and ``key`` (a metrics-role API key) into appliance-metrics.key, mode 0600. Returns what was written."""
    dest.mkdir(parents=True, exist_ok=True)
    texts = {PROMETHEUS: prometheus_config(target, scrape_interval), RULES: alert_rules(ttft_target_s)}
    written = []
    for name in SHIPPED:
        path = dest / name
        path.write_text(texts.get(name) or shipped(name), encoding="utf-8")
        written.append(path)
    if target.ca is not None:
        shutil.copyfile(target.ca, dest / CA_FILE)
        written.append(dest / CA_FILE)
    if key is not None:
        path = dest / KEY_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key + "\n")
        os.chmod(path, 0o600)
        written.append(path)
    return written
