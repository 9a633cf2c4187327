"""Build a :class:`HardwareSnapshot` of the live box from the layered detectors.

Every detector runs inside its own guard: whatever it raises becomes a
finding, so detection never takes the daemon down. All roots and libraries are
parameters, which is how tests run the real code against fake trees.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from appliance.hardware.amd import AmdSmi, detect_amd
from appliance.hardware.base import DetectorResult
from appliance.hardware.cpu import detect_cpu
from appliance.hardware.nvidia import detect_nvidia
from appliance.hardware.nvml import NvmlModule
from appliance.hardware.snapshot import CpuInfo, Finding, HardwareSnapshot


def _guarded(name: str, fn: Callable[[], DetectorResult]) -> DetectorResult:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a detector bug must not crash the daemon
        return DetectorResult(findings=[Finding(name, "error", f"{name} detector failed: {type(exc).__name__}: {exc}")])


def detect_hardware(
    *,
    proc_root: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
    dev_root: Path = Path("/dev"),
    nvml: NvmlModule | None = None,
    amdsmi: AmdSmi | None = None,
) -> HardwareSnapshot:
    """Snapshot this machine: CPU and RAM, NVIDIA GPUs (NVML), AMD GPUs (amdsmi or sysfs)."""
    findings: list[Finding] = []
    try:
        cpu, cpu_findings = detect_cpu(proc_root, sys_root)
        findings.extend(cpu_findings)
    except Exception as exc:  # noqa: BLE001
        cpu = CpuInfo(model="unknown", physical_cores=1, threads=1, memory_total=0, memory_available=0)
        findings.append(Finding("cpu", "error", f"cpu detector failed: {type(exc).__name__}: {exc}"))
    nv = _guarded("nvidia", lambda: detect_nvidia(nvml, sys_root, dev_root))
    amd = _guarded("amd", lambda: detect_amd(amdsmi, sys_root, dev_root))
    findings.extend(nv.findings + amd.findings)
    if not nv.gpus and not amd.gpus:
        findings.append(Finding("gpu", "info", "no usable GPU: models run on the CPU with llama.cpp"))
    return HardwareSnapshot(
        cpu=cpu,
        gpus=tuple(nv.gpus + amd.gpus),
        findings=tuple(findings),
        hostname=socket.gethostname(),
        nvidia_driver=nv.driver_version,
        cuda_version=nv.runtime_version,
        rocm_version=amd.runtime_version,
        taken_at=time.time(),
    )
