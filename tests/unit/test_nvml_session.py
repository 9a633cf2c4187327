"""One NVML session: detection, telemetry, energy and calibration share it; started once, retried after a failure."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import appliance.hardware.energy as energy
import appliance.hardware.nvml as nvml
import appliance.hardware.telemetry as telemetry
from appliance.hardware.energy import EnergyMeter
from appliance.hardware.errors import NvmlInitFailed
from appliance.hardware.nvidia import detect_nvidia
from appliance.hardware.nvml import NvmlSession
from appliance.hardware.telemetry import sample_telemetry
from appliance.metrics import Metrics
from appliance.planner.calibration import gpu_bytes_of

MiB = 1 << 20


class _NVMLError(Exception):
    pass


class OneGpuNVML:
    """A stand-in for pynvml with one GPU; counts starts, stops and handle look-ups; can fail its first start."""

    NVMLError = _NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, failed_starts: int = 0) -> None:
        self.failed_starts = failed_starts
        self.inits = self.shutdowns = self.lookups = 0

    def nvmlInit(self) -> None:
        if self.failed_starts:
            self.failed_starts -= 1
            raise _NVMLError("Driver Not Loaded")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.120"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self.lookups += 1
        return f"gpu{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA L4"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return "GPU-aaa"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(total=23034 * MiB, free=22000 * MiB, used=1034 * MiB)

    def nvmlDeviceGetCudaComputeCapability(self, h: str) -> tuple[int, int]:
        return (8, 9)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=7)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 16500

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 72000

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 41

    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
        raise _NVMLError("not supported")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        return 5_000_000

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=512 * MiB)]


@pytest.fixture()
def shared(monkeypatch: pytest.MonkeyPatch) -> tuple[NvmlSession, OneGpuNVML]:
    """The process's session, on the stand-in library, for every module that reads through it."""
    library = OneGpuNVML()
    session = NvmlSession(lambda: library)
    for module in (nvml, telemetry, energy):
        monkeypatch.setattr(module, "SESSION", session)
    return session, library


def test_every_reader_shares_one_session(shared: tuple[NvmlSession, OneGpuNVML], tmp_path: Path) -> None:
    session, library = shared
    [gpu] = detect_nvidia(sys_root=tmp_path, dev_root=tmp_path).gpus
    assert (gpu.name, gpu.memory_total, gpu.temperature_c, gpu.power_draw_w) == ("NVIDIA L4", 23034 * MiB, 41.0, 16.5)
    [sample] = sample_telemetry(Metrics())["gpus"]
    assert (sample["name"], sample["utilization_percent"], sample["power_watts"]) == ("NVIDIA L4", 7, 16.5)
    meter = EnergyMeter()
    assert meter.source == "nvml" and meter.read_joules() == 5000.0
    assert gpu_bytes_of([os.getpid()]) == 512 * MiB
    assert (library.inits, library.shutdowns, library.lookups) == (1, 0, 1)  # started once, one handle look-up
    session.close()
    assert library.shutdowns == 1


def test_a_failed_start_is_retried_on_the_next_use() -> None:
    library = OneGpuNVML(failed_starts=1)
    session = NvmlSession(lambda: library)
    with pytest.raises(NvmlInitFailed) as failed:
        session.open()
    assert "Driver Not Loaded" in str(failed.value.cause)
    assert session.count() == 1 and library.inits == 1


def test_a_library_handed_in_gets_its_own_session_shut_after_use(shared: tuple[NvmlSession, OneGpuNVML], tmp_path: Path) -> None:
    _, library = shared
    own = OneGpuNVML()
    assert len(detect_nvidia(own, sys_root=tmp_path, dev_root=tmp_path).gpus) == 1
    assert (own.inits, own.shutdowns) == (1, 1)
    assert library.inits == 0  # the process's session was not touched
