"""The console's usage routes in-process: the htmx swap and its address, filters refused by name, the CSV's filters."""

from __future__ import annotations

import csv
import io
import sqlite3
import time

import pytest

from appliance.accounts.users import create_user
from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.services import Services
from appliance.settings import Settings
from tests.unit.test_webui_app import signed_in


@pytest.fixture
def console(tmp_path):
    settings = Settings(data_dir=tmp_path, seed_default_model=False, currency="CHF")
    dbmod.migrate(settings.db_path)
    services = Services(settings)
    create_user(services.db, "victor", "victor-password-1", role="viewer")
    now = time.time()
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("INSERT INTO teams (id, name, created_at) VALUES (1, 'red', 0), (2, 'blue', 0)")
        conn.execute(
            "INSERT INTO api_keys (id, name, prefix, secret_hash, role, team_id, priority, created_at)"
            " VALUES (1, 'r', 'ak_red', 'h1', 'user', 1, 'interactive', 0), (2, 'b', 'ak_blue', 'h2', 'user', 2, 'interactive', "
            "0)"
        )
        conn.executemany(
            "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, prompt_tokens, completion_tokens, "
            "cached_tokens,"
            " latency_ms, status, cache_tier, cost) VALUES (?, ?, ?, ?, 'chat', 'fam:q4', ?, ?, 0, 50, 200, 'miss', 0.25)",
            [("a", now - 60, 1, 1, 11, 7), ("b", now - 120, 2, 2, 5, 3), ("c", now - 40 * 86400, 1, 1, 1000, 1000)],
        )
    client = signed_in(create_app(settings, services=services), "victor")
    yield client
    client.__exit__(None, None, None)
    services.db.dispose()


def test_the_filter_form_swaps_the_report_and_pushes_its_address(console):
    full = console.get("/usage", params={"team": "red"})
    assert full.status_code == 200 and "<html" in full.text and 'data-testid="total-requests">1<' in full.text
    assert "Budgets this window" in full.text and "CHF" in full.text
    swap = console.get(
        "/usage",
        params={"range": "7d", "from": "2020-01-01", "to": "", "team": "red", "key": "", "model": ""},
        headers={"HX-Request": "true"},
    )
    assert swap.status_code == 200 and "<html" not in swap.text and 'id="usage-report"' in swap.text
    assert swap.headers["HX-Push-Url"] == "/usage?range=7d&team=red"  # a preset ignores stray dates; empty filters are left out
    assert 'data-testid="total-prompt">11<' in swap.text
    restore = console.get("/usage", params={"team": "red"}, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in restore.text  # back button: htmx restores the whole page


@pytest.mark.parametrize(
    "params, param",
    [
        ({"team": "green"}, "team"),
        ({"key": "ak_nobody"}, "key"),
        ({"model": "other"}, "model"),
        ({"range": "fortnight"}, "range"),
        ({"range": "custom", "from": "soon"}, "from"),
        ({"range": "custom", "from": "2026-02-01", "to": "2026-01-01"}, "from"),
        ({"range": "custom", "from": "2000-01-01"}, "from"),
    ],
)
def test_unknown_filters_are_a_400_naming_the_param(console, params, param):
    for path in ("/usage", "/usage.csv"):
        response = console.get(path, params=params, headers={"HX-Request": "true"})
        assert response.status_code == 400, (path, params)
        assert param in response.text


def test_the_csv_honours_the_filters(console):
    rows = list(csv.DictReader(io.StringIO(console.get("/usage.csv", params={"key": "ak_blue", "by": "team"}).text)))
    assert [(r["team"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [("blue", "5", "3")]
    rows = list(csv.DictReader(io.StringIO(console.get("/usage.csv", params={"range": "today", "model": "fam"}).text)))
    assert [r["hour"][11:] for r in rows] != [] and sum(int(r["total_tokens"]) for r in rows) == 26  # today: by the hour
    old = list(
        csv.DictReader(io.StringIO(console.get("/usage.csv", params={"range": "custom", "from": "60d", "team": "red"}).text))
    )
    assert sum(int(r["prompt_tokens"]) for r in old) == 1011
    assert console.get("/usage.csv", params={"by": "secret"}).status_code == 400
