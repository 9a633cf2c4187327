"""Overview figures: GPU/CPU cards from telemetry samples, serving figures from the usage ledger."""

from __future__ import annotations

import time

from sqlalchemy import insert

from appliance.db.engine import make_engine, migrate
from appliance.db.tables import Usage
from appliance.webui import stats
from appliance.webui.render import render


def _sample(t: float, util: float, used: int) -> dict:
    gpu = {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_percent": util,
        "memory_used_bytes": used,
        "memory_total_bytes": 80 * 2**30,
        "power_watts": 300.5,
        "temperature_celsius": 61,
    }
    return {
        "t": t,
        "cpu_percent": util / 2,
        "memory_used_bytes": 8 * 2**30,
        "memory_total_bytes": 64 * 2**30,
        "gpus": [gpu, {**gpu, "index": 1, "utilization_percent": None, "power_watts": None}],
    }


def test_gpu_and_host_cards_from_samples():
    samples = [_sample(1000.0 + i * 5, 10.0 * i, i * 2**30) for i in range(6)]
    gpus = stats.gpu_cards(samples)
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["utilization"] == 50.0 and gpus[0]["util_series"] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert gpus[0]["memory_series"][-1] == 100.0 * 5 / 80
    assert gpus[1]["utilization"] is None and gpus[1]["power_series"] == [None] * 6
    host = stats.host_card(samples)
    assert host["cpu_percent"] == 25.0 and host["memory_series"][0] == 12.5
    html = render("_overview_live.html", host=host, gpus=gpus, serving=_empty_serving(), instances=[], cache=None)
    assert html.count('data-testid="gpu-card"') == 2
    assert "NVIDIA H100 80GB HBM3" in html and "61 °C" in html and "300 W" in html and "<polyline" in html


def _empty_serving() -> dict:
    return {
        "requests_per_s": 0.0,
        "tokens_per_s": 0.0,
        "completion_tokens_per_s": 0.0,
        "requests_hour": 0,
        "errors_hour": 0,
        "cache_hit_rate": None,
        "ttft_p50": None,
        "ttft_p95": None,
        "tokens_series": [0.0] * 30,
    }


def test_serving_figures_come_from_the_ledger(tmp_path):
    migrate(tmp_path / "a.db")
    db = make_engine(tmp_path / "a.db")
    now = time.time()
    # Every fourth request is a cache replay (first byte in ~1 ms): it must not count towards the engine's TTFT.
    rows = [
        dict(
            request_id=f"r{i}",
            created_at=now - i,
            endpoint="chat",
            model="m:v",
            prompt_tokens=10,
            completion_tokens=20,
            ttft_ms=1.0 if i % 4 == 0 else float(10 * (i + 1)),
            status=200,
            cache_tier="exact" if i % 4 == 0 else "miss",
        )
        for i in range(20)
    ]
    rows.append(
        dict(
            request_id="old",
            created_at=now - 7200,
            endpoint="chat",
            model="m:v",
            prompt_tokens=1,
            completion_tokens=1,
            ttft_ms=None,
            status=200,
            cache_tier="miss",
        )
    )
    with db.begin() as conn:
        conn.execute(insert(Usage), rows)
    s = stats.serving(db, now=now)
    assert s["requests_hour"] == 20
    assert abs(s["requests_per_s"] - 20 / 60) < 1e-9 and abs(s["tokens_per_s"] - 600 / 60) < 1e-9
    assert s["cache_hit_rate"] == 25.0
    assert s["ttft_p50"] == 110.0 and s["ttft_p95"] == 190.0  # of the 15 engine answers (20 ... 200 ms)
    assert len(s["tokens_series"]) == 30 and s["tokens_series"][-1] == 400 / 60
    db.dispose()
