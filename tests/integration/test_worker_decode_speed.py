"""The llama.cpp worker counts its decode-only steps; the daemon turns them into a measured speed.

A real worker on a tiny random-weight model: after requests, ``/stats`` holds the counters, and
:func:`decode_speed_from_stats` makes a per-stream rate of them at the number of streams that ran.
"""

from __future__ import annotations

import asyncio

from appliance.planner.calibration import decode_speed_from_stats
from tests.ggufkit import WorkerProcess, make_tiny_gguf


def test_decode_only_counters_give_a_per_stream_rate(tmp_path):
    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    with WorkerProcess(model, tmp_path / "w.sock", ctx=256, parallel=4) as w:

        async def four_streams():
            async with w.client() as c:
                return await asyncio.gather(
                    *[
                        c.post(
                            "/v1/completions",
                            json={"prompt": f"story {i}", "max_tokens": 48, "temperature": 0, "logit_bias": {"2": -100}},
                        )
                        for i in range(4)
                    ]
                )

        answers = asyncio.run(four_streams())
        assert all(r.status_code == 200 for r in answers)
        with w.sync_client() as c:
            stats = c.get("/stats").json()
    assert 0 < stats["decode_only_tokens_total"] <= 4 * 48
    assert stats["decode_only_stream_ms_total"] >= stats["decode_only_ms_total"] > 0
    speed = decode_speed_from_stats(stats)
    assert speed is not None and speed.tokens_per_s > 0 and 1 <= speed.streams <= 4
