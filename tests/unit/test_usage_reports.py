"""Roll-ups, usage queries, and the admin API + CLI for usage, quotas, prices and teams."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.api.metrics import MetricsController
from appliance.api.usage import CONTROLLERS
from appliance.cli import usage as usage_cli
from appliance.cli.client import check
from appliance.metering.admin import QuotaService
from appliance.metering.box_figures import BoxFigures
from appliance.metering.meter import Meter
from appliance.metering.reports import parse_time, query_usage
from appliance.metering.rollups import rollup
from tests.appkit import local_admin_app
from tests.meterkit import T0, Clock, add_key, add_team, new_db, rows, settings, sqlite_memory_used

HOUR, DAY = 3600, 86400


@pytest.fixture
def db(tmp_path):
    engine = new_db(tmp_path / "a.db")
    yield engine
    engine.dispose()


def usage_row(db, rid, t, key_id=None, team_id=None, model="m", prompt=10, completion=20, cost=0.5, status=200, energy=None):
    with sqlite3.connect(db.url.database) as conn:
        conn.execute(
            "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, prompt_tokens, completion_tokens,"
            " cached_tokens, status, cache_tier, cost, energy_joules) VALUES (?, ?, ?, ?, 'chat', ?, ?, ?, 0, ?, 'miss', ?, ?)",
            (rid, t, key_id, team_id, model, prompt, completion, status, cost, energy),
        )


def rollups(db, period):
    return rows(
        db,
        "SELECT bucket_start, key_id, model, requests, prompt_tokens, completion_tokens, cost FROM usage_rollups"
        " WHERE period = ? ORDER BY bucket_start, key_id, model",
        period,
    )


def test_rollup_is_idempotent_and_picks_up_late_rows(db):
    k1, k2 = add_key(db, "one"), add_key(db, "two")
    usage_row(db, "a", T0 + 10, k1.id)
    usage_row(db, "b", T0 + 20, k1.id)
    usage_row(db, "c", T0 + HOUR + 5, k2.id, model="n")
    assert rollup(db, T0 + 2 * HOUR) == 2
    assert rollups(db, "hour") == [(T0, k1.id, "m", 2, 20, 40, 1.0), (T0 + HOUR, k2.id, "n", 1, 10, 20, 0.5)]
    assert rollups(db, "day") == [(T0, k1.id, "m", 2, 20, 40, 1.0), (T0, k2.id, "n", 1, 10, 20, 0.5)]
    before = rows(db, "SELECT * FROM usage_rollups ORDER BY id")
    assert rollup(db, T0 + 2 * HOUR) == 0  # nothing new: nothing touched
    assert rollup(db, T0 + 2 * HOUR, full=True) == 2
    assert [r[1:] for r in rows(db, "SELECT * FROM usage_rollups ORDER BY period, bucket_start, key_id")] == sorted(
        [r[1:] for r in before], key=lambda r: (r[0], r[1], r[2])
    )
    usage_row(db, "late", T0 + 30, k1.id)  # written late into the first hour
    assert rollup(db, T0 + 3 * HOUR) == 1
    assert rollups(db, "hour")[0] == (T0, k1.id, "m", 3, 30, 60, 1.5)
    assert rollups(db, "day")[0] == (T0, k1.id, "m", 3, 30, 60, 1.5)


def test_query_groups_and_filters(db):
    team = add_team(db, "blue")
    k1, k2 = add_key(db, "one", team), add_key(db, "two")
    usage_row(db, "a", T0 + 10, k1.id, team, model="fam:q4")
    usage_row(db, "b", T0 + DAY + 10, k1.id, team, model="fam:q8", status=503, energy=2.5)
    usage_row(db, "c", T0 + 10, k2.id, model="other")
    report = query_usage(db, since=T0, until=T0 + 2 * DAY, by=("key", "day"))
    assert [(r["key"], r["day"], r["requests"]) for r in report["rows"]] == [
        ("ak_one", "2026-01-01", 1),
        ("ak_one", "2026-01-02", 1),
        ("ak_two", "2026-01-01", 1),
    ]
    assert report["totals"]["requests"] == 3 and report["totals"]["failed"] == 1 and report["totals"]["energy_joules"] == 2.5
    assert query_usage(db, since=T0, until=T0 + 2 * DAY, model="fam")["rows"][0]["requests"] == 2  # family matches variants
    assert query_usage(db, since=T0, until=T0 + 2 * DAY, model="fam:q4")["rows"][0]["requests"] == 1
    assert query_usage(db, since=T0, until=T0 + 2 * DAY, team_id=team, by=("team",))["rows"][0]["team"] == "blue"
    assert query_usage(db, since=T0 + 2 * DAY, until=T0 + 3 * DAY)["rows"] == []


def test_parse_time():
    now = T0 + 1000
    assert parse_time("7d", now, param="since") == now - 7 * DAY
    assert parse_time("2026-01-01", now, param="since") == T0
    assert parse_time("2026-01-01T01:00:00+01:00", now, param="since") == T0
    assert parse_time(str(int(T0)), now, param="since") == T0


@pytest.fixture
def app(tmp_path, db):
    meter = Meter(settings(tmp_path), db, clock=Clock())
    services = SimpleNamespace(db=db, meter=meter, metrics=meter.metrics, quotas=QuotaService(db, meter), settings=meter.settings)
    services.figures = BoxFigures(meter.settings, db, dict)  # the box's live figures from the same ledger
    application = local_admin_app([*CONTROLLERS, MetricsController], services, exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(application) as client:
        yield client, meter
    meter.close()


def test_admin_api_round_trip(app, db):
    client, meter = app
    key = add_key(db, "one")
    assert client.post("/admin/teams", json={"name": "blue"}).status_code == 201
    assert client.post("/admin/teams", json={"name": "blue"}).status_code == 409
    assert client.post("/admin/teams", json={"name": "../x"}).status_code == 400
    assert [t["name"] for t in client.get("/admin/teams").json()] == ["blue"]

    r = client.put(f"/admin/quotas/key:{key.name}", json={"tokens_per_day": 1000, "cost_per_month": 5})
    assert r.status_code == 200 and r.json()["limits"]["tokens_per_day"] == 1000
    r = client.put(f"/admin/quotas/key:{key.id}", json={"tokens_per_day": None})
    assert r.json()["limits"] == {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "tokens_per_day": None,
        "tokens_per_month": None,
        "cost_per_month": 5.0,
        "max_concurrent": None,
    }
    assert client.put("/admin/quotas/team:blue", json={"tokens_per_day": -1}).status_code == 400
    assert client.put("/admin/quotas/team:blue", json={"bogus": 1}).status_code == 400
    assert client.put("/admin/quotas/team:nope", json={"tokens_per_day": 1}).status_code == 404
    assert client.get("/admin/quotas/somebody").status_code == 400
    assert client.delete("/admin/quotas/team:blue").status_code == 204

    assert client.put("/admin/prices/*", json={"input_per_m": 1.5}).json() == {
        "model": "*",
        "input_per_m": 1.5,
        "output_per_m": 0.0,
        "cached_per_m": 0.0,
    }
    assert client.put("/admin/prices/fam:q4", json={"output_per_m": 3}).status_code == 200
    assert client.put("/admin/prices/..%2Fetc", json={"output_per_m": 3}).status_code in (400, 404)
    assert [p["model"] for p in client.get("/admin/prices").json()] == ["*", "fam:q4"]
    assert client.get("/admin/prices/fam:q4").json()["output_per_m"] == 3.0
    assert client.get("/admin/prices/nope").status_code == 404
    assert meter.prices.rate("fam", "q4").output_per_m == 3.0  # the meter saw the change

    actions = [a for (a,) in rows(db, "SELECT action FROM audit_log ORDER BY id")]
    assert actions == ["team.create", "quota.set", "quota.set", "quota.delete", "price.set", "price.set"]


def test_usage_endpoint_json_and_csv(app, db):
    client, _ = app
    key = add_key(db, "one")
    usage_row(db, "a", T0 + 10, key.id, model="=cmd")
    r = client.get("/admin/usage", params={"since": str(int(T0)), "until": str(int(T0 + DAY)), "by": "key,model"})
    assert r.status_code == 200
    assert [(row["key"], row["model"], row["requests"]) for row in r.json()["rows"]] == [("ak_one", "=cmd", 1)]
    r = client.get("/admin/usage", params={"since": str(int(T0)), "until": str(int(T0 + DAY)), "by": "model", "format": "csv"})
    assert r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert table[0]["model"] == "'=cmd" and table[0]["requests"] == "1"  # no spreadsheet formula
    assert client.get("/admin/usage", params={"by": "secret"}).status_code == 400
    assert client.get("/admin/usage", params={"format": "xml"}).status_code == 400
    assert client.get("/admin/usage", params={"since": "yesterday-ish"}).status_code == 400
    for param, value in (("key", "ak_nobody"), ("team", "nobody"), ("model", "no-such-model")):
        r = client.get("/admin/usage", params={param: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_metrics_endpoint(app):
    client, meter = app
    meter.metrics.observe_request("m", 200, 120.0, 900.0, 10, 20, "miss")
    meter.metrics.set_gauge_source("queue_depth", lambda: {"m": 3})
    r = client.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert 'appliance_requests_total{model="m",status="200",cache_tier="miss"} 1' in r.text
    assert 'appliance_queue_depth{model="m"} 3' in r.text


def test_cli_talks_to_the_admin_api(app, db, monkeypatch):
    client, _ = app
    add_key(db, "one")

    def request(ctx, method, path, **kwargs):
        return check(client.request(method, path, **kwargs))

    monkeypatch.setattr(usage_cli, "request", request)
    group = click.Group("appliancectl")
    usage_cli.register(group)
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(group, list(args), catch_exceptions=False)
        return result.exit_code, result.output

    assert run("teams", "create", "blue")[0] == 0
    assert "blue" in run("teams", "ls")[1]
    code, out = run("quota", "set", "ak_one", "--tokens-per-day", "5000", "--max-concurrent", "4")
    assert code == 0 and "5000" in out
    code, out = run("quota", "show", "key:ak_one", "--json")
    assert json.loads(out)["limits"]["max_concurrent"] == 4
    run("quota", "set", "ak_one", "--max-concurrent", "none")
    assert json.loads(run("quota", "show", "ak_one", "--json")[1])["limits"]["max_concurrent"] is None
    assert run("quota", "set", "blue")[0] != 0  # nothing to set
    assert run("quota", "set", "team:blue", "--cost-per-month", "12.5")[0] == 0
    assert run("prices", "set", "*", "--input", "1", "--output", "2")[0] == 0
    assert "2" in run("prices", "show")[1]
    usage_row(db, "a", T0 + 10, 1)
    code, out = run("usage", "--since", str(int(T0)), "--until", str(int(T0 + DAY)), "--by", "key", "--format", "csv")
    assert code == 0 and out.splitlines()[1].startswith("1,ak_one,one,1,")
    assert run("usage", "--by", "model")[0] == 0
    code, out = run("quota", "show", "team:nobody")
    assert code != 0 and "No team" in out


def test_a_rollup_gives_back_the_page_cache_its_reads_filled(db):
    with sqlite3.connect(db.url.database) as conn:  # an hour of ledger rows: ~6 MiB of pages
        conn.executemany(
            "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, prompt_tokens, completion_tokens,"
            " cached_tokens, status, cache_tier, cost) VALUES (?, ?, NULL, NULL, 'chat', 'm', 10, 20, 0, 200, 'miss', 0.5)",
            [(f"r{i:06d}-" + "x" * 24, T0 + i % HOUR) for i in range(60_000)],
        )
    db.dispose()
    with db.connect() as conn:  # the pool holds one connection, as the daemon's holds several
        conn.exec_driver_sql("SELECT 1")
    idle = sqlite_memory_used()
    assert rollup(db, T0 + HOUR) == 1
    assert rollups(db, "hour") == [(T0, None, "m", 60_000, 600_000, 1_200_000, 30_000.0)]
    # Without the shrink, the connection keeps its 2 MiB page cache full of ledger pages for as long as it lives.
    assert sqlite_memory_used() - idle < 512 * 1024
