"""The planner predicts decode and prompt speed, and picks the best quality that meets the interactive floor.

Hand arithmetic uses the constants of ``appliance/planner/speed.py``: a CPU core reads 15 GB/s and
does 50 GFLOP/s with AVX-512, one after the other (a CPU's step takes the read time plus the compute
time); the average stream is half way through its context.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from appliance.db import engine as dbmod
from appliance.hardware.snapshot import GpuInfo
from appliance.hardware.units import GiB
from appliance.planner.calibration import (
    DecodeSpeed,
    decode_speed_from_stats,
    load_calibrations,
    record_decode_speed,
    record_load,
)
from appliance.planner.plan import CalibrationPoint, Plan, Preferences, plan, plan_all
from appliance.planner.speed import UNKNOWN_GPU, gpu_spec
from tests.unit.test_planner import machine, variants

PREFS = Preferences(min_context=8192, parallel=1, memory_margin=GiB, vllm_available=False)


def planned(box: str, family: str, only: str | None = None, **kw: object) -> Plan:
    chosen = [v for v in variants(family) if only in (None, v.name)]
    p = plan(machine(box), chosen, replace(PREFS, **kw))
    assert isinstance(p, Plan), p
    return p


def test_cpu_decode_adds_reading_and_computing_at_one_stream() -> None:
    # llama-3.1-8b Q4_K_M on 2 AVX-512 cores, one stream, 8k context:
    #   weights read = 4_920_734_016 - token embeddings 321_912_510 (one row is looked up) = 4_598_821_506
    #   KV read = 8 kv heads x (128 + 128) x 2 B x 32 layers x 4096 tokens (half of 8k) = 536_870_912
    #   memory: 5_135_692_418 B / (2 x 15 GB/s) = 0.17119 s;  compute: 2 x 7_504_658_432 params
    #   + 4 x 32 x 32 x 128 x 4096 attention = 17_156_800_512 FLOP / 100 GFLOP/s = 0.17157 s
    #   -> one step 0.17119 + 0.17157 = 0.34276 s: 2.918 tok/s; prompt 1 / 0.17157 = 5.83 tok/s
    p = planned("cpu_2core_24g", "llama-3.1-8b", min_decode_tps=0, only="q4_k_m")
    assert p.variant == "q4_k_m" and p.decode_tps == pytest.approx(2.918, abs=0.01)
    assert p.prompt_tps == pytest.approx(5.8, abs=0.1)
    assert "~2.9 tok/s, ~5.8 prompt tok/s" in p.reason


def test_the_floor_picks_the_best_quality_that_is_fast_enough_and_says_why() -> None:
    fast = planned("cpu_2core_24g", "llama-3.2-1b", min_decode_tps=10)
    assert fast.variant == "q8_0" and fast.decode_tps >= 10
    assert "F16 would decode ~8.5 tok/s on CPU < the 10 tok/s floor" in fast.reason
    quality = planned("cpu_2core_24g", "llama-3.2-1b", min_decode_tps=0)
    assert quality.variant == "f16" and quality.decode_tps < 10


def test_when_nothing_is_fast_enough_the_fastest_is_chosen() -> None:
    p = planned("cpu_2core_24g", "llama-3.1-8b", min_decode_tps=10)
    assert p.variant == "q4_k_m"  # 1.45 tok/s for F16, 2.9 for Q4_K_M
    assert "nothing that fits reaches the 10 tok/s floor per stream, so the fastest is chosen" in p.reason
    assert "Q5_K_M would decode ~2.7 tok/s on CPU < the 10 tok/s floor" in p.reason


def test_more_streams_share_the_engine() -> None:
    one = planned("nvidia_l4_24g", "llama-3.1-8b", min_decode_tps=0, min_context=4096)
    eight = planned("nvidia_l4_24g", "llama-3.1-8b", min_decode_tps=0, min_context=4096, parallel=8)
    assert one.variant == eight.variant == "f16"
    assert eight.decode_tps < one.decode_tps and eight.aggregate_tps > one.aggregate_tps
    assert eight.aggregate_tps == pytest.approx(8 * eight.decode_tps, rel=1e-3)
    assert "per stream at 8 streams" in eight.reason
    assert len(eight.decode_curve) == 8 and eight.decode_curve[0] == pytest.approx(one.decode_tps, rel=1e-2)


def test_faster_machines_decode_faster() -> None:
    speeds = [
        planned(box, "llama-3.1-8b", min_decode_tps=0, only="q4_k_m").decode_tps
        for box in ("cpu_2core_24g", "nvidia_l4_24g", "nvidia_rtx4090_24g", "nvidia_8xh100_80g")
    ]
    assert speeds == sorted(speeds) and speeds[0] < 10 < speeds[1]


def test_a_partial_offload_is_slowed_by_its_cpu_layers() -> None:
    # Q4_K_M with 40 of 80 layers on the L4: the 4-core host reads its 40 layers (40 x 515_674_792 B) and the
    # output head (633_206_110 B) = 21.26e9 B per token at 4 x 10 GB/s: 0.53 s, so below 1.9 tok/s whatever the GPU does.
    part = planned("nvidia_l4_24g", "llama-3.1-70b", min_decode_tps=0)
    assert part.n_gpu_layers == 40 and part.decode_tps < 1.9
    gpu_only = planned("nvidia_l4_24g", "llama-3.1-8b", min_decode_tps=0)
    assert gpu_only.decode_tps > 5 * part.decode_tps


def test_gpu_table_knows_the_fixture_machines() -> None:
    for box, bandwidth in (
        ("nvidia_8xh100_80g", 3350),
        ("nvidia_l4_24g", 300),
        ("nvidia_t4_16g", 320),
        ("nvidia_rtx4090_24g", 1008),
        ("nvidia_2x3060_12g", 360),
        ("amd_mi300x_192g", 5300),
    ):
        assert gpu_spec(machine(box).gpus[0])[0] == bandwidth
    odd = GpuInfo(index=0, vendor="nvidia", name="Imaginary X1", memory_total=1, memory_free=1, memory_used=0)
    assert gpu_spec(odd) == UNKNOWN_GPU


def test_a_measured_cpu_bandwidth_replaces_the_per_core_figure() -> None:
    box = machine("cpu_2core_24g")
    fast = replace(box, cpu=replace(box.cpu, memory_bandwidth=40 * 10**9))
    p = plan(fast, [v for v in variants("llama-3.1-8b") if v.name == "q4_k_m"], replace(PREFS, min_decode_tps=0))
    assert isinstance(p, Plan)
    # memory 5_135_692_418 / 40e9 = 0.1284 s + compute 0.1716 s = 0.3000 s: 3.33 tok/s (2.92 at 2 x 15 GB/s)
    assert p.decode_tps == pytest.approx(3.334, abs=0.01)


def test_measured_speeds_correct_the_estimate() -> None:
    base = planned("cpu_2core_24g", "llama-3.2-1b", min_decode_tps=0)
    own = CalibrationPoint(
        "llama-3.2-1b:f16", "llamacpp", 8192, 0, 0, estimated_decode_tps=7.65, measured_decode_tps=15.3, decode_streams=1
    )
    p = plan(machine("cpu_2core_24g"), variants("llama-3.2-1b"), replace(PREFS, min_decode_tps=10), [own])
    assert isinstance(p, Plan)
    assert p.variant == "f16" and p.speed_correction == pytest.approx(2.0)  # measured twice as fast: F16 meets the floor
    assert p.decode_tps == pytest.approx(2 * base.decode_tps, rel=1e-3) and "(calibrated)" in p.reason
    assert p.estimated_bytes == base.estimated_bytes  # a speed-only row corrects no memory estimate
    # Another variant on the same backend takes the median of the measured ratios.
    other = plan(machine("cpu_2core_24g"), variants("qwen2.5-0.5b"), replace(PREFS, min_decode_tps=0), [own])
    assert isinstance(other, Plan) and other.speed_correction == pytest.approx(2.0)


def test_plan_rows_carry_speeds() -> None:
    rows = {r.variant: r for r in plan_all(machine("cpu_2core_24g"), variants("llama-3.2-1b"), PREFS)}
    assert rows["q4_k_m"].decode_tps > rows["q8_0"].decode_tps > rows["f16"].decode_tps
    assert rows["q8_0"].chosen and "not chosen: would decode" in rows["f16"].reason
    assert rows["bf16"].decode_tps is None  # safetensors without vLLM: no placement


def test_vllm_plans_carry_speeds() -> None:
    p = plan(machine("nvidia_8xh100_80g"), variants("llama-3.1-70b"), replace(PREFS, vllm_available=True))
    assert isinstance(p, Plan) and p.backend == "vllm" and p.decode_tps and p.decode_tps >= 10


def test_the_floor_setting_reaches_the_planner() -> None:
    from appliance.hardware.software import SoftwareInfo
    from appliance.planner.service import preferences_for
    from appliance.settings import Settings

    prefs = preferences_for(Settings(data_dir="/nonexistent", min_decode_tokens_per_s=3.5), SoftwareInfo(None, (), False))
    assert prefs.min_decode_tps == 3.5
    assert Settings(data_dir="/nonexistent").min_decode_tokens_per_s == 10.0


def test_worker_counters_become_a_per_stream_rate() -> None:
    # 8 streams decoding 800 tokens in 10 s of steps: each stream made 100 tokens in 10 s = 10 tok/s.
    stats = {"decode_only_tokens_total": 800, "decode_only_ms_total": 10_000, "decode_only_stream_ms_total": 80_000}
    assert decode_speed_from_stats(stats) == DecodeSpeed(10.0, 8)
    assert decode_speed_from_stats({**stats, "decode_only_tokens_total": 10}) is None  # too few to say
    assert decode_speed_from_stats({}) is None


def test_a_measured_speed_is_stored_beside_the_estimate(tmp_path: Path) -> None:
    path = tmp_path / "appliance.db"
    dbmod.migrate(path)
    db = dbmod.make_engine(path)
    try:
        p = planned("cpu_2core_24g", "llama-3.2-1b", parallel=4, min_decode_tps=0)
        point = record_decode_speed(db, p, DecodeSpeed(20.0, 2))
        assert point is not None and point.estimated_decode_tps == p.decode_curve[1] and point.measured_bytes == 0
        assert record_decode_speed(db, p, DecodeSpeed(20.0, 9)) is None  # more streams than the plan has
        record_load(db, p, 3 * GiB)
        (stored,) = load_calibrations(db)
        assert stored.measured_decode_tps == 20.0 and stored.decode_streams == 2 and stored.measured_bytes == 3 * GiB
    finally:
        db.dispose()
