"""Usage report maths: time buckets, nearest-rank percentiles, cache savings, filters and the accessible charts."""

from __future__ import annotations

import sqlite3
from html.parser import HTMLParser

import pytest

from appliance.errors import BadRequest
from appliance.metering.reports import query_usage, to_csv
from appliance.metering.series import bucket_for, bucket_label, bucket_starts, percentile
from appliance.metering.usage_filters import custom_range, filter_choices, parse_to, preset_range, resolve_filters
from appliance.webui.chart_axes import TimeAxis
from appliance.webui.charts import time_chart
from tests.meterkit import T0, add_key, add_team, new_db

HOUR, DAY = 3600, 86400


@pytest.fixture
def db(tmp_path):
    engine = new_db(tmp_path / "a.db")
    yield engine
    engine.dispose()


def ledger(
    db,
    rid,
    t,
    *,
    key_id=None,
    team_id=None,
    model="fam:q4",
    variant=None,
    prompt=10,
    completion=20,
    cost=0.0,
    tier="miss",
    ttft=None,
    latency=100.0,
    status=200,
):
    with sqlite3.connect(db.url.database) as conn:
        conn.execute(
            "INSERT INTO usage (request_id, created_at, key_id, team_id, endpoint, model, variant, prompt_tokens, "
            "completion_tokens,"
            " cached_tokens, ttft_ms, latency_ms, status, cache_tier, cost) VALUES (?, ?, ?, ?, 'chat', ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?)",
            (
                rid,
                t,
                key_id,
                team_id,
                model,
                variant,
                prompt,
                completion,
                prompt if tier != "miss" else 0,
                ttft,
                latency,
                status,
                tier,
                cost,
            ),
        )


# -- buckets ---------------------------------------------------------------------------------------
def test_ranges_up_to_two_days_are_drawn_by_the_hour_longer_ones_by_the_day():
    assert bucket_for(T0, T0 + DAY) == "hour"
    assert bucket_for(T0, T0 + 2 * DAY) == "hour"
    assert bucket_for(T0, T0 + 2 * DAY + 1) == "day"


def test_bucket_starts_cover_the_range_aligned_to_utc():
    assert bucket_starts(T0, T0 + DAY, "hour") == [T0 + h * HOUR for h in range(24)]
    assert bucket_starts(T0 + 90 * 60, T0 + 3 * HOUR + 1, "hour") == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]
    assert bucket_starts(T0 + 5, T0 + 7 * DAY, "day") == [T0 + d * DAY for d in range(7)]
    assert bucket_starts(T0, T0, "day") == []


def test_bucket_labels_are_the_ledger_group_labels():
    assert bucket_label(T0 + 13 * HOUR, "hour") == "2026-01-01T13:00:00Z"
    assert bucket_label(T0 + 31 * DAY, "day") == "2026-02-01"


def test_bucket_labels_match_what_the_report_groups_by(db):
    ledger(db, "a", T0 + 13 * HOUR + 59 * 60)
    ledger(db, "b", T0 + DAY + 1)
    assert [r["hour"] for r in query_usage(db, since=T0, until=T0 + 2 * DAY, by=("hour",))["rows"]] == [
        bucket_label(T0 + 13 * HOUR, "hour"),
        bucket_label(T0 + DAY, "hour"),
    ]
    assert [r["day"] for r in query_usage(db, since=T0, until=T0 + 2 * DAY, by=("day",))["rows"]] == [
        bucket_label(T0, "day"),
        bucket_label(T0 + DAY, "day"),
    ]


# -- percentiles -----------------------------------------------------------------------------------
def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 21)]  # 1 … 20
    assert percentile(values, 50) == 10.0
    assert percentile(values, 95) == 19.0
    assert percentile(values, 100) == 20.0
    assert percentile([7.0], 50) == 7.0 and percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.0 and percentile([1.0, 2.0], 95) == 2.0
    assert percentile([], 50) is None
    assert percentile([float(v) for v in range(1, 101)], 95) == 95.0  # exact rank, no float drift past it
    with pytest.raises(ValueError):
        percentile(values, 0)


def test_report_percentiles_per_bucket_and_overall(db):
    for i in range(10):  # first hour: engine answers 10 … 100 ms to first token
        ledger(db, f"a{i}", T0 + i, ttft=10.0 * (i + 1), latency=100.0 * (i + 1))
    ledger(db, "hit", T0 + 20, tier="exact", ttft=0.5, latency=1.0)  # a cache replay: latency yes, engine TTFT no
    ledger(db, "fail", T0 + 30, ttft=5000.0, latency=9000.0, status=500)  # failures count in neither
    ledger(db, "b", T0 + HOUR, ttft=200.0, latency=300.0)
    report = query_usage(db, since=T0, until=T0 + DAY, by=("hour",))
    first, second = report["rows"]
    assert (first["ttft_p50_ms"], first["ttft_p95_ms"]) == (50.0, 100.0)
    assert (first["latency_p50_ms"], first["latency_p95_ms"]) == (500.0, 1000.0)  # 1, 100 … 1000: 11 values
    assert (second["ttft_p50_ms"], second["latency_p95_ms"]) == (200.0, 300.0)
    totals = report["totals"]  # over all the values, not a sum or mean of the buckets'
    assert (totals["ttft_p50_ms"], totals["ttft_p95_ms"]) == (60.0, 200.0)
    assert totals["requests"] == 13 and totals["failed"] == 1


# -- cache savings -----------------------------------------------------------------------------------
def test_cache_savings_are_the_list_price_less_the_charge(db):
    with sqlite3.connect(db.url.database) as conn:
        conn.execute(
            "INSERT INTO prices (model, input_per_m, output_per_m, cached_per_m) VALUES ('fam', 1000000, 2000000, 100000)"
        )
        conn.execute(
            "INSERT INTO prices (model, input_per_m, output_per_m, cached_per_m) VALUES ('fam:q8', 10000000, 10000000, 0)"
        )
    team = add_team(db, "blue")
    key = add_key(db, "one", team)
    ledger(db, "miss", T0 + 1, key_id=key.id, team_id=team, prompt=10, completion=20, cost=50.0)
    ledger(db, "hit", T0 + 2, key_id=key.id, team_id=team, prompt=10, completion=20, cost=3.0, tier="exact")  # list: 10 + 40
    ledger(db, "hit8", T0 + 3, model="fam:q8", prompt=1, completion=1, cost=0.0, tier="semantic")  # list: 10 + 10
    report = query_usage(db, since=T0, until=T0 + DAY, by=("key",))
    with_key, without = sorted(report["rows"], key=lambda r: r["key"] or "")[::-1]
    assert (with_key["cache_hits"], with_key["cache_tokens"], with_key["cache_saved"]) == (1, 30, 47.0)
    assert (without["cache_hits"], without["cache_tokens"], without["cache_saved"]) == (1, 2, 20.0)
    assert (report["totals"]["cache_hits"], report["totals"]["cache_tokens"], report["totals"]["cache_saved"]) == (2, 32, 67.0)
    assert "cache_saved" in to_csv(report).splitlines()[0]


# -- filters ----------------------------------------------------------------------------------------
def test_presets_are_whole_utc_days_ending_today():
    now = T0 + 14 * DAY + 5 * HOUR  # 2026-01-15 05:00
    assert preset_range("today", now) == (T0 + 14 * DAY, T0 + 15 * DAY)
    assert preset_range("7d", now) == (T0 + 8 * DAY, T0 + 15 * DAY)
    assert preset_range("30d", now) == (T0 + 15 * DAY - 30 * DAY, T0 + 15 * DAY)
    assert preset_range("month", now) == (T0, T0 + 15 * DAY)
    assert preset_range("24h", now + 59) == (T0 + 13 * DAY + 6 * HOUR, T0 + 14 * DAY + 6 * HOUR)  # whole hours, this one too
    with pytest.raises(BadRequest) as err:
        preset_range("fortnight", now)
    assert err.value.param == "range"


def test_a_bare_date_as_to_includes_that_day():
    now = T0 + 40 * DAY
    assert parse_to("2026-01-01", now) == T0 + DAY
    assert parse_to("2026-01-01T06:00:00Z", now) == T0 + 6 * HOUR
    assert custom_range("2026-01-01", "2026-01-01", now) == (T0, T0 + DAY)
    assert custom_range(None, "2026-01-31", now) == (T0 + DAY, T0 + 31 * DAY)  # 30 days back
    assert custom_range("2026-01-01", "2026-01-01", now, end_param="until", end_excludes_date=True) == (T0, T0)
    with pytest.raises(BadRequest) as err:
        custom_range("2026-01-01", "last tuesday", now)
    assert err.value.param == "to"


def test_filters_resolve_names_and_refuse_unknown_ones_naming_the_param(db):
    team = add_team(db, "blue")
    key = add_key(db, "one", team)
    ledger(db, "a", T0, model="fam:q4")
    f = resolve_filters(db, since=T0, until=T0 + DAY, team="blue", key=key.name, model="fam")
    assert (f.team_id, f.key_id, f.model) == (team, key.id, "fam")
    assert resolve_filters(db, since=T0, until=T0 + DAY, key=str(key.id)).key_id == key.id
    assert resolve_filters(db, since=T0, until=T0 + DAY, model="fam:q4", team="").team_id is None
    for param, value in (
        ("team", "red"),
        ("key", "ak_nobody"),
        ("key", "999"),
        ("model", "other"),
        ("model", "fam:q8"),
        ("model", "fa"),
    ):
        with pytest.raises(BadRequest) as err:
            resolve_filters(db, since=T0, until=T0 + DAY, **{param: value})
        assert err.value.param == param, (param, value)
    with pytest.raises(BadRequest) as err:
        resolve_filters(db, since=T0 + DAY, until=T0)
    assert err.value.param == "from"
    choices = filter_choices(db)
    assert choices.teams == ["blue"] and choices.keys == [(key.name, "one")] and choices.models == ["fam", "fam:q4"]


# -- charts -----------------------------------------------------------------------------------------
class _Parts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_time_chart_names_itself_and_carries_its_numbers_as_a_table():
    axis = TimeAxis(starts=(T0, T0 + DAY), bucket="day")
    html = time_chart("c1", "Tokens per day", "Prompt and completion <tokens>", axis, [("In", [10, 0]), ("Out", [5, None])])
    parts = _Parts()
    parts.feed(str(html))
    svg = next(a for t, a in parts.tags if t == "svg")
    assert svg["role"] == "img" and svg["aria-labelledby"] == "c1-t c1-d"
    assert ("title", {"id": "c1-t"}) in parts.tags and ("desc", {"id": "c1-d"}) in parts.tags
    assert "Prompt and completion <tokens>" in parts.text  # escaped, read back as text
    assert "<tokens>" not in str(html)
    bars = [a for t, a in parts.tags if t == "rect" and a.get("class") != "hit"]
    assert len(bars) == 2  # zero and missing values draw no bar
    assert ("table", {"class": "visually-hidden", "data-testid": "c1-table"}) in parts.tags
    cells = [t for t in parts.text if t.strip()]
    assert cells[-10:] == ["Tokens per day", "Time (UTC)", "In", "Out", axis.label(0), "10", "5", axis.label(1), "0", "–"]
    three = TimeAxis(starts=(T0, T0 + DAY, T0 + 2 * DAY), bucket="day")
    lines = str(time_chart("c2", "p50", "d", three, [("p50", [1.0, None, 3.0])], kind="lines"))
    assert lines.count("<polyline") == 1 and "<script" not in lines and "style=" not in lines
