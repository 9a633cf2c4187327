"""Calibration: measured loads stored, handed to the planner as data, and reported with their error."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.db import engine as dbmod
from appliance.hardware.snapshot import HardwareSnapshot
from appliance.hardware.units import GiB
from appliance.planner.calibration import (
    calibration_report,
    estimation_error,
    gpu_bytes_of,
    load_calibrations,
    measure,
    record_load,
)
from appliance.planner.plan import CalibrationPoint, Plan, Preferences, plan
from appliance.planner.types import DeviceMemory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MiB = 1 << 20


@pytest.fixture()
def engine(tmp_path: Path):
    path = tmp_path / "appliance.db"
    dbmod.migrate(path)
    eng = dbmod.make_engine(path)
    yield eng
    eng.dispose()


def cpu_plan(estimated: int, calibration: int = 0, context: int = 8192) -> Plan:
    row = DeviceMemory.of("cpu", estimated, 0, 0, 0, 10 * GiB)
    return Plan(
        model="gemma-3-270m:q4_k_m",
        variant="q4_k_m",
        backend="llamacpp",
        model_path="x",
        context=context,
        parallel=1,
        threads=2,
        n_gpu_layers=0,
        devices=("cpu",),
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        kv_cache_dtype="f16",
        gpu_memory_utilization=None,
        quantization="Q4_K_M",
        estimated_bytes=estimated,
        memory=(row,),
        reason="",
        calibration_bytes=calibration,
    )


def test_record_and_load(engine) -> None:
    point = record_load(engine, cpu_plan(400 * MiB), 420 * MiB)
    assert point == CalibrationPoint("gemma-3-270m:q4_k_m", "llamacpp", 8192, 400 * MiB, 420 * MiB)
    assert load_calibrations(engine) == (point,)
    # Same estimate again: the larger measurement stays (pages touched by traffic only add up).
    record_load(engine, cpu_plan(400 * MiB), 410 * MiB)
    record_load(engine, cpu_plan(400 * MiB), 450 * MiB)
    assert load_calibrations(engine)[0].measured_bytes == 450 * MiB
    # A new formula estimate replaces the row.
    record_load(engine, cpu_plan(430 * MiB), 440 * MiB)
    assert load_calibrations(engine) == (CalibrationPoint("gemma-3-270m:q4_k_m", "llamacpp", 8192, 430 * MiB, 440 * MiB),)


def test_the_uncorrected_estimate_is_what_is_stored(engine) -> None:
    # A plan already corrected by +50 MiB estimated 450 MiB; its formula said 400 MiB.
    record_load(engine, cpu_plan(450 * MiB, calibration=50 * MiB), 455 * MiB)
    assert load_calibrations(engine)[0].estimated_bytes == 400 * MiB


def test_gpu_plans_need_gpu_bytes(engine) -> None:
    gpu = replace(cpu_plan(6 * GiB), devices=("cuda:0",), n_gpu_layers=-1)
    assert record_load(engine, gpu, 500 * MiB) is None
    point = record_load(engine, gpu, 500 * MiB, gpu_bytes=6 * GiB)
    assert point is not None and point.measured_bytes == 6 * GiB + 500 * MiB
    assert record_load(engine, cpu_plan(1), None) is None


def test_report_gives_the_error() -> None:
    p = CalibrationPoint("m:v", "llamacpp", 512, 90, 100)
    assert estimation_error(p) == pytest.approx(-0.10)
    assert calibration_report([p]) == [
        {
            "variant": "m:v",
            "backend": "llamacpp",
            "context": 512,
            "estimated_bytes": 90,
            "measured_bytes": 100,
            "error_pct": -10.0,
            "decode_streams": None,
            "estimated_decode_tps": None,
            "measured_decode_tps": None,
        }
    ]


def test_planner_uses_the_stored_rows(engine) -> None:
    import json

    from appliance.modelfacts import ModelFacts
    from appliance.planner.plan import Variant

    box = HardwareSnapshot.from_json((FIXTURES / "hardware" / "cpu_2core_24g.json").read_text())
    data = json.loads((FIXTURES / "models" / "gemma-3-270m.json").read_text())
    q4 = Variant("gemma-3-270m", "q4_k_m", "gguf", "Q4_K_M", 253_113_024, ModelFacts.from_dict(data["facts"]))
    prefs = Preferences(min_context=8192, parallel=1, min_decode_tps=0)
    first = plan(box, [q4], prefs, load_calibrations(engine))
    assert isinstance(first, Plan) and not first.calibrated
    record_load(engine, first, first.estimated_bytes + 64 * MiB)
    second = plan(box, [q4], prefs, load_calibrations(engine))
    assert isinstance(second, Plan) and second.estimated_bytes == first.estimated_bytes + 64 * MiB
    # Recording the corrected plan again stores the same formula estimate: no drift.
    record_load(engine, second, first.estimated_bytes + 64 * MiB)
    assert load_calibrations(engine)[0].estimated_bytes == first.estimated_bytes


def test_measure_this_process() -> None:
    fp = measure(os.getpid())
    assert fp.rss_bytes > 10 * MiB and fp.gpu_bytes is None


def test_gpu_bytes_from_nvml_per_process() -> None:
    class FakeNVML:
        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlDeviceGetCount(self) -> int:
            return 2

        def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
            return i

        def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
            return [SimpleNamespace(pid=10, usedGpuMemory=3 * GiB), SimpleNamespace(pid=99, usedGpuMemory=GiB)]

    assert gpu_bytes_of([10, 11], FakeNVML()) == 6 * GiB  # pid 10 on both GPUs
    assert gpu_bytes_of([10]) in (None, 0)  # the real NVML: no driver on this box -> None
