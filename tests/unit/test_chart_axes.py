"""The console charts' pure parts: units as people read them, round gridline values, time ticks on round moments,
and the SVG a time chart is drawn with (labels, hover values, no script and no inline style)."""

from __future__ import annotations

from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest

from appliance.metering.series import DAY, HOUR, bucket_starts
from appliance.webui.chart_axes import TimeAxis, time_ticks, value_ticks
from appliance.webui.charts import sparkline, time_chart
from appliance.webui.units import axis_formatter, compact, duration, exact_formatter


def _t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (7, "7"), (950, "950"), (999.4, "999"), (1000, "1k"), (1500, "1.5k"), (12_345, "12k"), (999_999, "1M"),
     (3_400_000, "3.4M"), (2.5e9, "2.5B"), (0.25, "0.25"), (2.5, "2.5")],
)  # fmt: skip
def test_counts_read_in_k_m_b(value, text):
    assert compact(value) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0 ms"), (2.5, "2.5 ms"), (850, "850 ms"), (999.4, "999 ms"), (1000, "1 s"), (1250, "1.25 s"), (12_340, "12.3 s"),
     (125_000, "125 s")],
)  # fmt: skip
def test_durations_read_in_ms_then_s(ms, text):
    assert duration(ms) == text


def test_money_carries_the_configured_currency_and_decimals_that_line_up():
    tick = axis_formatter("money", "EUR", alongside=0.0075)
    assert [tick(v) for v in (0, 0.0025, 0.0075)] == ["0.00000 EUR", "0.00250 EUR", "0.00750 EUR"]
    assert axis_formatter("money", "EUR", alongside=20)(12.5) == "12.50 EUR"
    assert exact_formatter("money", "CHF")(0.000123) == "0.000123 CHF"
    assert exact_formatter("tokens")(12_345) == "12,345" and exact_formatter("count")(3) == "3"
    assert axis_formatter("tokens")(25_000) == "25k" and axis_formatter("ms")(1500) == "1.5 s"
    assert [axis_formatter("ms", alongside=40_000)(v) for v in (0, 2500, 40_000)] == ["0 s", "2.5 s", "40 s"]
    assert [axis_formatter("ms", alongside=750)(v) for v in (0, 250, 750)] == ["0 ms", "250 ms", "750 ms"]


@pytest.mark.parametrize(
    ("high", "ticks"),
    [(0, [0, 1]), (1, [0, 0.25, 0.5, 0.75, 1]), (7, [0, 2, 4, 6, 8]), (95, [0, 25, 50, 75, 100]), (1234, [0, 500, 1000, 1500]),
     (0.0031, [0, 0.001, 0.002, 0.003, 0.004]), (4000, [0, 1000, 2000, 3000, 4000])],
)  # fmt: skip
def test_gridlines_fall_on_round_values_from_zero_past_the_largest(high, ticks):
    found = value_ticks(high)
    assert found == pytest.approx(ticks)
    assert found[-1] >= high and 2 <= len(found) <= 6


def test_counted_things_get_whole_steps():
    assert value_ticks(2, whole=True) == [0, 1, 2]
    assert value_ticks(1, whole=True) == [0, 1]
    assert value_ticks(7, whole=True) == [0, 2, 4, 6, 8]
    assert value_ticks(10, whole=True) == [0, 5, 10]  # not 2.5 requests
    assert value_ticks(0.2, whole=True) == [0, 1] and value_ticks(1234, whole=True) == [0, 500, 1000, 1500]


def test_a_day_by_the_hour_is_ticked_every_six_hours_and_midnight_names_the_day():
    starts = bucket_starts(_t("2026-12-05T00:00:00"), _t("2026-12-06T00:00:00"), "hour")
    ticks = time_ticks(starts, "hour")
    assert [(t.index, t.label) for t in ticks] == [(0, "Dec 5"), (6, "06:00"), (12, "12:00"), (18, "18:00")]


def test_a_rolling_day_ticks_whole_hours_that_are_multiples_of_the_step():
    starts = bucket_starts(_t("2026-12-04T15:00:00"), _t("2026-12-05T15:00:00"), "hour")
    labels = [t.label for t in time_ticks(starts, "hour")]
    assert labels == ["18:00", "Dec 5", "06:00", "12:00"]
    two_days = bucket_starts(_t("2026-12-04T00:00:00"), _t("2026-12-06T00:00:00"), "hour")
    assert [t.label for t in time_ticks(two_days, "hour")] == ["Dec 4", "12:00", "Dec 5", "12:00"]


def test_days_are_ticked_daily_then_on_mondays_then_on_months():
    week = bucket_starts(_t("2026-11-29T00:00:00"), _t("2026-12-06T00:00:00"), "day")
    assert [t.label for t in time_ticks(week, "day")] == ["Nov 29", "Nov 30", "Dec 1", "Dec 2", "Dec 3", "Dec 4", "Dec 5"]
    month = bucket_starts(_t("2026-11-06T00:00:00"), _t("2026-12-06T00:00:00"), "day")
    mondays = time_ticks(month, "day")
    assert [t.label for t in mondays] == ["Nov 9", "Nov 16", "Nov 23", "Nov 30"]  # 2026-11-09 is a Monday
    assert all(datetime.fromtimestamp(month[t.index], UTC).weekday() == 0 for t in mondays)
    long = bucket_starts(_t("2025-01-10T00:00:00"), _t("2027-09-01T00:00:00"), "day")  # under the 1,000 days charted
    ticks = time_ticks(long, "day")
    assert len(ticks) <= 7 and [t.label for t in ticks][:2] == ["Jul 2025", "Jan 2026"]


def test_ticks_stay_few_whatever_the_range():
    for days in (1, 2, 3, 9, 14, 31, 62, 200, 400, 999):
        bucket = "hour" if days <= 2 else "day"
        starts = bucket_starts(_t("2026-01-01T00:00:00"), _t("2026-01-01T00:00:00") + days * DAY, bucket)
        ticks = time_ticks(starts, bucket)
        assert 1 <= len(ticks) <= 7, (days, ticks)
        assert [t.index for t in ticks] == sorted({t.index for t in ticks})
    assert time_ticks([], "hour") == []
    assert time_ticks([_t("2026-01-01T05:00:00")], "hour")[0].label == "05:00"
    assert HOUR == 3600


class _Parts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict]] = []
        self.texts: list[tuple[str, str, str]] = []  # (tag, class, text)

    def handle_starttag(self, tag, attrs):
        self.stack.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self.stack and data.strip():
            tag, attrs = self.stack[-1]
            self.texts.append((tag, attrs.get("class") or "", data))


def test_time_chart_labels_its_axes_in_its_unit_and_says_each_bucket_on_hover():
    starts = bucket_starts(_t("2026-12-05T00:00:00"), _t("2026-12-06T00:00:00"), "hour")
    axis = TimeAxis(starts=tuple(starts), bucket="hour")
    tokens = [0.0] * 24
    tokens[14] = 1234.0
    html = str(time_chart("c", "Tokens <per> hour", "d", axis, [("In", tokens), ("Out", [None] * 24)], unit="tokens"))
    parts = _Parts()
    parts.feed(html)
    ys = [text for tag, cls, text in parts.texts if cls == "tick-y"]
    xs = [text for tag, cls, text in parts.texts if cls == "tick-x"]
    assert ys == ["0", "500", "1k", "1.5k"] and xs == ["Dec 5", "06:00", "12:00", "18:00"]
    titles = [text for tag, _, text in parts.texts if tag == "title"]
    assert titles[0] == "Tokens <per> hour" and "&lt;per&gt;" in html
    assert "2026-12-05 14:00 UTC — In: 1,234 tokens · Out: –" in titles
    assert len(titles) == 1 + 24  # the chart's own, then one per hour
    assert "style=" not in html and "<script" not in html
    cells = [text for tag, _, text in parts.texts if tag in ("td", "th")]
    assert cells[:3] == ["Time (UTC)", "In", "Out"] and "1,234" in cells
    money = str(time_chart("m", "Cost", "d", axis, [("Cost", [0.004] + [0.0] * 23)], unit="money", currency="EUR"))
    parts = _Parts()
    parts.feed(money)
    assert [text for _, cls, text in parts.texts if cls == "tick-y"][-1] == "0.00400 EUR"
    lines = str(time_chart("l", "TTFT", "d", axis, [("p50", [None] * 23 + [850.0])], unit="ms", kind="lines"))
    assert lines.count("<polyline") == 1 and "850 ms" in lines and "1 s" in lines


def test_sparklines_say_each_value_on_hover_and_their_span():
    html = str(sparkline([10, None, 43.4], top=100, label="CPU <use>", unit="%", span="5 min"))
    parts = _Parts()
    parts.feed(html)
    assert [text for tag, _, text in parts.texts if tag == "title"] == ["CPU <use>: 10%", "CPU <use>: 43%"]
    assert 'aria-label="CPU &lt;use&gt;, last 5 min, now 43%"' in html and "style=" not in html
    assert [text for tag, cls, text in parts.texts if tag == "span"] == ["5 min ago", "max 43%", "now"]
    assert "<title>tok: 1.5k tok/s</title>" in str(sparkline([0, 1500], label="tok", unit="tok/s"))
