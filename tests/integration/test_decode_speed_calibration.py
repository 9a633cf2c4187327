"""The real daemon keeps how fast a llama.cpp engine really decoded, and the next plan uses it.

A daemon with the real default model: requests decode more than 64 tokens, the model is unloaded
through the admin API (the daemon reads the engine's decode-only counters before stopping it), and
the stored calibration row holds a measured per-stream rate beside the plan's own estimate at that
many streams; the next plan's speeds are scaled by measured / estimated.
"""

from __future__ import annotations

import pytest

from appliance.db.engine import make_engine
from appliance.planner.calibration import load_calibrations
from tests.daemon import start_daemon

pytestmark = pytest.mark.slow


def test_unload_stores_the_measured_decode_speed_and_the_next_plan_uses_it(tmp_path):
    daemon = start_daemon(tmp_path, APPLIANCE_CACHE_ENABLED="false", APPLIANCE_ENGINE_PARALLEL="2")
    try:
        key = daemon.create_key("speed")
        with daemon.client(key) as client:
            for i in range(2):
                r = client.post(
                    "/v1/completions",
                    json={
                        "model": "default",
                        "prompt": f"Tale {i}: once upon a time",
                        "max_tokens": 48,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                )
                assert r.status_code == 200, r.text
        with daemon.admin() as admin:
            instance = admin.get("/admin/instances/").json()[0]
            name = instance["model"]
            assert admin.post(f"/admin/instances/{name}/unload").json()["unloaded"] is True
            db = make_engine(daemon.data_dir / "appliance.db")
            try:
                (point,) = [p for p in load_calibrations(db) if p.variant_key == name and p.measured_decode_tps]
            finally:
                db.dispose()
            assert point.measured_decode_tps > 0 and point.decode_streams == 1 and point.estimated_decode_tps > 0
            after = admin.get("/admin/plan", params={"model": name}).json()["plan"]
        ratio = point.measured_decode_tps / point.estimated_decode_tps
        assert after["speed_correction"] == pytest.approx(ratio, rel=1e-6)
        assert after["decode_tps"] == pytest.approx(after["decode_curve"][-1] * ratio, rel=0.02)
        assert "(calibrated)" in after["reason"]
    finally:
        daemon.stop()
