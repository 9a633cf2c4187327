"""Prometheus exposition, telemetry sampling, and energy attribution from a (fake) RAPL tree."""

from __future__ import annotations

import re

import pytest

from appliance.hardware.energy import EnergyMeter
from appliance.hardware.telemetry import sample_telemetry
from appliance.metrics import Metrics


def test_exposition_counters_histograms_and_escaping():
    m = Metrics()
    m.observe_request('we"ird\\name', 200, 40.0, 800.0, 5, 7, "exact", energy_joules=1.5)
    m.observe_request("m", 200, 40.0, 2000.0, 5, 7, "miss")
    m.observe_request("m", 503, None, 10.0, 5, 0, "miss")
    m.observe_refusal("m", "tokens_per_day")
    text = m.render()
    assert 'appliance_requests_total{model="we\\"ird\\\\name",status="200",cache_tier="exact"} 1' in text
    assert 'status="429"' not in text  # a refusal is counted by dimension; the gateway observes the request
    assert 'appliance_tokens_total{model="m",kind="prompt"} 10' in text
    assert 'appliance_cache_hits_total{tier="exact"} 1' in text and "appliance_cache_misses_total 2" in text
    assert 'appliance_quota_refusals_total{model="m",dimension="tokens_per_day"} 1' in text
    assert 'appliance_ttft_seconds_bucket{model="m",source="engine",le="0.05"} 1' in text
    assert 'appliance_ttft_seconds_bucket{model="m",source="engine",le="0.025"} 0' in text
    assert 'appliance_request_latency_seconds_bucket{model="m",source="engine",le="+Inf"} 2' in text
    assert 'appliance_request_latency_seconds_count{model="m",source="engine"} 2' in text
    # cache hits are counted apart, so they never flatter the engine's percentiles
    assert 'appliance_ttft_seconds_count{model="we\\"ird\\\\name",source="cache"} 1' in text
    assert 'appliance_ttft_seconds_count{model="we\\"ird\\\\name",source="engine"}' not in text
    # every sample line is `name{labels} value`
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r"[a-z_]+(\{.*\})? -?[0-9.e+Inf-]+", line), line


def test_gauge_sources_are_pulled_at_scrape_and_failures_skipped():
    m = Metrics()
    m.set_gauge_source("loaded_instances", lambda: 2)
    m.set_gauge_source("kv_slots_in_use", lambda: {"a": 3, "b": 1})
    m.set_gauge_source("broken", lambda: 1 / 0)
    m.set_gauge_source("nothing", lambda: None)
    m.set_gauge_source("custom", lambda: {("x", "y"): 1.5}, help="Custom.", labels=("one", "two"))
    text = m.render()
    assert "# TYPE appliance_loaded_instances gauge\nappliance_loaded_instances 2" in text
    assert 'appliance_kv_slots_in_use{model="a"} 3' in text
    assert 'appliance_custom{one="x",two="y"} 1.5' in text
    assert "broken" not in text and "nothing" not in text


def test_telemetry_ring_buffer_and_gauges():
    m = Metrics(telemetry_samples=3)
    for _ in range(5):
        sample = sample_telemetry(m)
    history = m.telemetry_history()
    assert len(history) == 3 and history[-1] is sample
    assert sample["memory_total_bytes"] > 0 and isinstance(sample["gpus"], list)
    assert "appliance_memory_total_bytes" in m.render()


def _zone(root, name, uj, max_range=None):
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{uj}\n")
    if max_range is not None:
        (zone / "max_energy_range_uj").write_text(f"{max_range}\n")
    return zone


def test_rapl_counter_with_wraparound_and_subzones_ignored(tmp_path):
    pkg = _zone(tmp_path, "intel-rapl:0", 1_000_000, max_range=10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 999_000_000)  # a part of package 0: not added again
    meter = EnergyMeter(use_nvml=False, rapl_root=tmp_path)
    assert meter.source == "rapl"
    assert meter.read_joules() == 0.0
    (pkg / "energy_uj").write_text("9000000")
    assert meter.read_joules() == pytest.approx(8.0)
    (pkg / "energy_uj").write_text("500000")  # wrapped at 10 J
    assert meter.read_joules() == pytest.approx(8.0 + 1.0 + 0.5)


def test_interval_energy_is_split_among_active_requests(tmp_path):
    pkg = _zone(tmp_path, "intel-rapl:0", 0, max_range=10**12)
    meter = EnergyMeter(use_nvml=False, rapl_root=tmp_path)

    def at(joules):
        (pkg / "energy_uj").write_text(str(int(joules * 1e6)))

    at(100)  # idle energy before any request is nobody's
    a = meter.begin()
    at(110)
    b = meter.begin()
    at(120)
    assert meter.end(a) == pytest.approx(10 + 5)
    at(130)
    assert meter.end(b) == pytest.approx(5 + 10)


def test_no_counter_means_unknown_not_zero(tmp_path):
    meter = EnergyMeter(use_nvml=False, rapl_root=tmp_path / "absent")
    assert meter.source is None and meter.read_joules() is None
    assert meter.end(meter.begin()) is None
    unreadable = _zone(tmp_path / "r", "intel-rapl:0", 5)
    (unreadable / "energy_uj").unlink()  # e.g. root-only on this kernel
    assert EnergyMeter(use_nvml=False, rapl_root=tmp_path / "r").source is None
