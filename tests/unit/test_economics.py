"""What a token costs the owner, engine utilisation from overlapping intervals, and headroom."""

from __future__ import annotations

import pytest

from appliance.metering.attainment import LedgerRow
from appliance.metering.economics import OwnerRates, busy_seconds, economics, report_owner_cost, window_cost
from tests.meterkit import T0


def test_busy_time_is_the_union_of_overlapping_intervals_clipped_to_the_window():
    spans = [(10.0, 20.0), (15.0, 25.0), (24.0, 26.0), (40.0, 50.0), (45.0, 47.0), (-5.0, 2.0), (98.0, 130.0), (60.0, 60.0)]
    assert busy_seconds(spans, 0.0, 100.0) == pytest.approx(16.0 + 10.0 + 2.0 + 2.0)
    assert busy_seconds([], 0.0, 100.0) == 0.0
    assert busy_seconds([(0.0, 1e9)], 0.0, 100.0) == 100.0  # never more than the window
    assert busy_seconds([(200.0, 300.0)], 0.0, 100.0) == 0.0


def test_window_cost_with_and_without_measured_energy():
    rates = OwnerRates(box_cost_per_hour=2.0, energy_price_per_kwh=0.25, box_power_watts=500.0)
    # 2 h: 4.00 hardware; measured 3.6 MJ = 1 kWh -> 0.25
    assert window_cost(rates, 7200.0, 3.6e6) == pytest.approx(4.25)
    # nothing measured: 500 W for 2 h = 1 kWh -> 0.25 as well
    assert window_cost(rates, 7200.0, None) == pytest.approx(4.25)
    # no price of energy: hardware only, whatever was measured
    assert window_cost(OwnerRates(2.0, 0.0, 500.0), 7200.0, 7.2e6) == pytest.approx(4.0)
    assert not OwnerRates(0.0, 0.0, 500.0).known


def _row(t, model, latency_s, tokens, energy=None, tier="miss"):
    return LedgerRow(T0 + t, model, "interactive", 10.0, latency_s * 1000.0, tokens, 200, tier, energy)


def test_cost_per_million_split_by_busy_time_and_headroom():
    # an hour; model a busy 900 s (two overlapping requests 0-600 and 300-900), model b busy 300 s
    rows = [
        _row(0, "a", 600, 400_000),
        _row(300, "a", 600, 100_000),
        _row(1000, "b", 300, 250_000),
        _row(2000, "b", 1, 0, tier="exact"),
    ]
    rates = OwnerRates(box_cost_per_hour=1.2, energy_price_per_kwh=0.0)
    got = economics(rows, T0, T0 + 3600, rates, {"a": 100.0, "c": 50.0})
    assert got.tokens == 750_000 and got.tokens_per_hour == pytest.approx(750_000)
    assert got.cost == pytest.approx(1.2)
    assert got.cost_per_million == pytest.approx(1.2 / 0.75)
    a, b, c = got.models["a"], got.models["b"], got.models["c"]
    assert (a.busy_s, b.busy_s, c.busy_s) == (pytest.approx(900.0), pytest.approx(300.0), 0.0)
    assert a.utilisation == pytest.approx(0.25) and b.utilisation == pytest.approx(300 / 3600)
    assert a.cost == pytest.approx(0.9) and b.cost == pytest.approx(0.3)  # 3:1 busy time
    assert a.cost_per_million == pytest.approx(0.9 / 0.5) and b.cost_per_million == pytest.approx(0.3 / 0.25)
    assert a.headroom_tps == pytest.approx(75.0) and c.headroom_tps == pytest.approx(50.0) and b.headroom_tps is None
    assert c.cost_per_million is None  # loaded, idle, nothing produced


def test_measured_energy_is_priced_and_no_rates_means_unknown_cost():
    rows = [_row(0, "a", 10, 1000, energy=1.8e6), _row(20, "a", 10, 1000, energy=1.8e6)]
    with_energy = economics(rows, T0, T0 + 3600, OwnerRates(1.0, 0.5, 9999.0), {})
    assert with_energy.energy_joules == pytest.approx(3.6e6)
    assert with_energy.cost == pytest.approx(1.0 + 0.5)  # the configured draw is not used when energy was measured
    assert with_energy.cost_per_million == pytest.approx(1.5 / 2000 * 1e6)
    without = economics(rows, T0, T0 + 3600, OwnerRates(), {})
    assert without.cost is None and without.models["a"].cost_per_million is None


def test_a_request_that_began_before_the_window_counts_its_busy_time_not_its_tokens():
    got = economics([_row(-100, "a", 400, 5000)], T0, T0 + 300, OwnerRates(3.0), {})
    assert got.models["a"].busy_s == pytest.approx(300.0) and got.tokens == 0 and got.cost_per_million is None


def test_report_rows_get_the_box_rate_times_their_tokens():
    report = {
        "since": T0,
        "until": T0 + 7200,
        "rows": [{"model": "a", "completion_tokens": 1000}, {"model": "b", "completion_tokens": 3000}],
        "totals": {"completion_tokens": 4000},
    }
    # the box made 8000 tokens in the range (the report is filtered to half of them); 1 h has passed of the 2
    out = report_owner_cost(report, OwnerRates(4.0), (8000, None), now=T0 + 3600)
    assert out["totals"]["owner_cost_per_million"] == pytest.approx(4.0 / 8000 * 1e6)
    assert [r["owner_cost"] for r in out["rows"]] == [pytest.approx(0.5), pytest.approx(1.5)]
    assert out["totals"]["owner_cost"] == pytest.approx(2.0)
    untouched = report_owner_cost({"since": T0, "until": T0 + 1, "rows": [{}], "totals": {}}, OwnerRates(), (1, None), T0)
    assert "owner_cost" not in untouched["totals"]
