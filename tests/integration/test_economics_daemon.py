"""Latency-target attainment and what a token costs, through the real daemon and a llama.cpp engine.

A daemon with the box's costs set (hardware per hour, an energy price, a power draw) answers chats for an
interactive key and a batch-priority key; then ``/metrics`` holds the attainment gauges per model and class (the
requests each counts matching what was sent), the tokens produced (matching the usage the client was told) and a
positive cost per million tokens; the console's overview shows the block with the model's rows; the usage CSV and
``appliancectl usage`` carry the owner's cost.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
import time

import httpx
import pytest

from appliance.accounts.users import create_user
from appliance.db.engine import make_engine
from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

GAUGE = re.compile(r"^(appliance_[a-z0-9_]+)\{([^}]*)\} ([0-9.e+-]+|NaN)$", re.M)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(
        tmp_path_factory.mktemp("economics"),
        APPLIANCE_BOX_COST_PER_HOUR="3.5",
        APPLIANCE_ENERGY_PRICE_PER_KWH="0.31",
        APPLIANCE_BOX_POWER_WATTS="420",
        APPLIANCE_CURRENCY="EUR",
    )
    engine = make_engine(running.data_dir / "appliance.db")
    create_user(engine, "olga", "olga-password-1", role="viewer")
    engine.dispose()
    yield running
    running.stop()


def gauges(daemon: RunningDaemon) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with daemon.admin() as admin:
        text = admin.get("/metrics").text
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for name, labels, value in GAUGE.findall(text):
        found.setdefault(name, {})[tuple(re.findall(r'(\w+)="([^"]*)"', labels))] = float(value)
    return found


def chat(client: httpx.Client, content: str, tokens: int) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": tokens, "temperature": 0}
    response = client.post("/v1/chat/completions", json=body, headers={"cache-control": "no-store"})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def sent(box: RunningDaemon) -> dict:
    """Three interactive chats and two from a batch-priority key, with sizes nobody planned for."""
    interactive, bulk = box.create_key("econ-inter"), box.create_key("econ-bulk", priority="batch")
    answers: dict[str, list[dict]] = {"interactive": [], "batch": []}
    with box.client(interactive) as client:
        for i, (text, n) in enumerate([("ünïcode · ✓ " * 7, 1), ("x", 5), ("Count: " + " ".join(map(str, range(60))), 13)]):
            answers["interactive"].append(chat(client, f"{time.time_ns()} {i} {text}", n))
    with box.client(bulk) as client:
        for i in range(2):
            answers["batch"].append(chat(client, f"{time.time_ns()} bulk {i} " + "z" * (97 * (i + 1)), 7))
    return answers


def test_metrics_show_attainment_tokens_and_cost_per_model_and_class(box: RunningDaemon, sent: dict):
    model = sent["interactive"][0]["model"]
    expected = {(("model", model), ("class", k), ("window", w)): len(a) for k, a in sent.items() for w in ("5m", "1h", "1d")}
    deadline = time.monotonic() + 90  # the scheduler re-reads the ledger every 10 s; a scrape reads only that
    found = gauges(box)
    while {k: found.get("appliance_latency_target_requests", {}).get(k) for k in expected} != expected:
        assert time.monotonic() < deadline, found.get("appliance_latency_target_requests")
        time.sleep(1)
        found = gauges(box)
    requests = found["appliance_latency_target_requests"]
    attained = found["appliance_latency_target_attainment"]
    for klass, answers in sent.items():
        for window in ("5m", "1h", "1d"):
            labels = (("model", model), ("class", klass), ("window", window))
            assert requests[labels] == len(answers), (labels, requests)
            assert 0.0 <= attained[labels] <= 1.0
            assert labels in found["appliance_ttft_p95_seconds"]
    told = sum(a["usage"]["completion_tokens"] for answers in sent.values() for a in answers)
    assert told > 0
    assert found["appliance_tokens_produced"][(("window", "1h"),)] == told
    per_million = found["appliance_cost_per_million_tokens"][(("model", model), ("window", "1h"))]
    box_wide = found["appliance_box_cost_per_million_tokens"][(("window", "1h"),)]
    # one model served everything: its share is the whole hour's cost, at least the hardware's 3.5 EUR over `told` tokens
    assert per_million == pytest.approx(box_wide) and per_million >= 3.5 / told * 1e6
    utilisation = found["appliance_engine_utilization_ratio"][(("model", model), ("window", "5m"))]
    assert 0.0 < utilisation <= 1.0
    assert found["appliance_headroom_tokens_per_second"][(("model", model),)] > 0


def test_the_overview_shows_the_block(box: RunningDaemon, sent: dict):
    model = sent["interactive"][0]["model"]
    client = httpx.Client(base_url=box.url, timeout=60)
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    signed = client.post("/login", data={"username": "olga", "password": "olga-password-1", "csrf_token": token})
    assert signed.status_code in (200, 303), signed.text
    html = client.get("/").text
    assert "Sign out" in html, html[-2000:]
    assert 'data-testid="economics"' in html
    for klass in ("interactive", "batch"):
        assert f'data-model="{model}" data-class="{klass}" data-window="5m"' in html
    assert re.search(r'data-testid="cost-per-million">[0-9.]+ EUR<', html)
    assert re.search(rf'data-testid="engine-economics">.*data-model="{re.escape(model)}"', html, re.S)
    exported = list(csv.DictReader(io.StringIO(client.get("/usage.csv", params={"by": "model", "range": "7d"}).text)))
    assert [r["model"] for r in exported] == [model] and float(exported[0]["owner_cost"]) > 0


def test_usage_csv_and_cli_carry_the_owner_cost(box: RunningDaemon, sent: dict):
    with box.admin() as admin:
        text = admin.get("/admin/usage", params={"by": "model", "format": "csv", "from": "1h"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and float(rows[0]["owner_cost"]) > 0 and float(rows[0]["owner_cost_per_million"]) > 0
    told = sum(a["usage"]["completion_tokens"] for answers in sent.values() for a in answers)
    assert float(rows[0]["owner_cost"]) == pytest.approx(float(rows[0]["owner_cost_per_million"]) * told / 1e6, rel=1e-3)
    environ = {k: v for k, v in box.env.items() if k.startswith("APPLIANCE_") or k in ("PATH", "HOME", "LANG")}
    environ["COLUMNS"] = "250"  # the table's every column whole
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "usage", "--by", "model", "--since", "1h"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "owner_cost" in result.stdout and re.search(
        r"per million tokens produced in this range: [0-9.e+-]+ EUR", result.stdout
    )


def test_admin_usage_box_reports_each_window(box: RunningDaemon, sent: dict):
    model = sent["interactive"][0]["model"]
    with box.admin() as admin:
        body = admin.get("/admin/usage/box").json()
    assert body["currency"] == "EUR" and set(body["windows"]) == {"5m", "1h", "1d"}
    for window in body["windows"].values():
        counted = {(a["model"], a["class"]): a["requests"] for a in window["attainment"]}
        assert counted == {(model, "interactive"): 3, (model, "batch"): 2}
        assert window["models"][model]["tokens_produced"] == window["tokens_produced"] > 0
        assert window["models"][model]["headroom_tps"] > 0


@pytest.mark.parametrize("spelling", ["/admin/usage/box", "/admin/usage/box/", "/ADMIN/usage/box", "/admin/usage/box?window=5m"])
def test_the_box_figures_are_for_admins_only(box: RunningDaemon, sent: dict, spelling: str):
    """Per-model traffic and the owner's cost are admin figures: no credential gets 401, a user key 403."""
    user = box.create_key(f"econ-user-{len(spelling)}-{spelling.count('/')}")
    anonymous = httpx.get(box.url + spelling, timeout=30)
    as_user = httpx.get(box.url + spelling, headers={"Authorization": f"Bearer {user}"}, timeout=30)
    for response in (anonymous, as_user):
        assert response.status_code in (401, 403, 404), (spelling, response.status_code, response.text)
        assert "tokens_produced" not in response.text
    if spelling.islower() and not spelling.endswith("/"):
        assert anonymous.status_code == 401 and as_user.status_code == 403
