"""Hardware detectors: real NVML failure on this box, fake NVML/amdsmi/sysfs trees, CPU parsing, snapshots."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.hardware import HardwareSnapshot, detect_hardware
from appliance.hardware.amd import detect_amd
from appliance.hardware.cpu import cgroup_memory_limit, detect_cpu, parse_cpuinfo
from appliance.hardware.nvidia import detect_nvidia
from appliance.hardware.software import SoftwareInfo, software_findings
from tests.strict_skips import impossible_here

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hardware"
MiB = 1 << 20


# --------------------------------------------------------------------------- NVIDIA
def test_nvidia_library_not_found_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    """The real pynvml on this GPU-less box: nvmlInit raises NVMLError_LibraryNotFound."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - a box with a driver
        pynvml.nvmlShutdown()
        impossible_here("this box has an NVIDIA driver, so the no-driver path cannot be exercised")
    result = detect_nvidia(sys_root=tmp_path, dev_root=tmp_path)  # real pynvml, empty PCI tree
    assert result.gpus == []
    [finding] = result.findings
    assert finding.severity == "info" and "NVML library not found" in finding.message


def test_nvidia_library_missing_beside_a_gpu_is_an_error_with_the_fix(tmp_path: Path) -> None:
    dev = tmp_path / "bus/pci/devices/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030000\n")
    result = detect_nvidia(sys_root=tmp_path, dev_root=tmp_path)  # real pynvml raises LibraryNotFound here
    [finding] = result.findings
    assert finding.severity == "error" and "1 NVIDIA GPU(s) on the PCI bus" in finding.message
    assert "install the NVIDIA driver" in (finding.fix or "")


class _NVMLError(Exception):
    pass


class FakeNVML:
    """A stand-in for pynvml with two GPUs; GPU1 is in MIG mode with one instance; some fields unsupported."""

    NVMLError = _NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.120"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetName(self, h: str) -> str:
        return {"gpu0": "NVIDIA L4", "gpu1": "NVIDIA H100 80GB HBM3", "mig1-0": "MIG"}[h]

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return {"gpu0": "GPU-aaa", "gpu1": "GPU-bbb", "mig1-0": "MIG-ccc"}[h]

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        total = {"gpu0": 23034, "gpu1": 81559, "mig1-0": 40192}[h] * MiB
        return SimpleNamespace(total=total, free=total - 100 * MiB, used=100 * MiB)

    def nvmlDeviceGetCudaComputeCapability(self, h: str) -> tuple[int, int]:
        if h.startswith("mig"):
            raise _NVMLError("not supported on MIG handles")
        return (8, 9) if h == "gpu0" else (9, 0)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=7)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 16500

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 72000

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        raise _NVMLError("not supported")

    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
        return (1, 1) if h == "gpu1" else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, i: int) -> str:
        if i == 1:
            raise _NVMLError("not found")
        return f"mig1-{i}"


def test_nvidia_devices_mig_and_unsupported_fields(tmp_path: Path) -> None:
    nvml = FakeNVML()
    result = detect_nvidia(nvml, sys_root=tmp_path, dev_root=tmp_path)
    assert nvml.shut
    assert (result.driver_version, result.runtime_version) == ("550.120", "12.4")
    l4, mig = result.gpus
    assert (l4.name, l4.compute_capability, l4.memory_total, l4.uuid) == ("NVIDIA L4", "8.9", 23034 * MiB, "GPU-aaa")
    assert (l4.utilization_pct, l4.power_draw_w, l4.power_limit_w, l4.temperature_c) == (7.0, 16.5, 72.0, None)
    assert l4.device_id == "cuda:0" and not l4.mig_enabled
    assert mig.mig_instance and mig.mig_enabled and mig.mig_slot == 0 and mig.index == 1
    assert mig.compute_capability == "9.0"  # inherited from the parent GPU
    assert mig.device_id == "cuda:MIG-ccc" and mig.label == "GPU1.MIG0"
    assert any("MIG mode" in f.message for f in result.findings)


def test_nvidia_no_permission_on_device_nodes(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        impossible_here("the suite runs as root, and root can open any device node")
    node = tmp_path / "nvidia0"
    node.write_text("")
    node.chmod(0)
    result = detect_nvidia(FakeNVML(), sys_root=tmp_path, dev_root=tmp_path)
    assert any("no read-write access to nvidia0" in f.message for f in result.findings)


def test_nvidia_init_no_permission_has_the_fix(tmp_path: Path) -> None:
    class NoPermission(Exception):
        pass

    NoPermission.__name__ = "NVMLError_NoPermission"
    nvml = FakeNVML()
    nvml.nvmlInit = lambda: (_ for _ in ()).throw(NoPermission())  # type: ignore[method-assign]
    [finding] = detect_nvidia(nvml, sys_root=tmp_path, dev_root=tmp_path).findings
    assert finding.severity == "error" and "video" in (finding.fix or "")


# --------------------------------------------------------------------------- AMD
def _fake_amd_card(root: Path, n: int, *, total_mib: int = 196592, used_mib: int = 284) -> None:
    dev = root / f"class/drm/card{n}/device"
    (dev / "hwmon/hwmon3").mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (dev / "device").write_text("0x74a1\n")
    (dev / "mem_info_vram_total").write_text(str(total_mib * MiB))
    (dev / "mem_info_vram_used").write_text(str(used_mib * MiB))
    (dev / "gpu_busy_percent").write_text("12\n")
    (dev / "hwmon/hwmon3/power1_average").write_text("140000000\n")
    (dev / "hwmon/hwmon3/power1_cap").write_text("750000000\n")
    (dev / "hwmon/hwmon3/temp1_input").write_text("41000\n")
    (root / f"class/drm/card{n}-DP-1").mkdir(parents=True)  # a connector, not a card


def test_amd_sysfs_fallback(tmp_path: Path) -> None:
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    _fake_amd_card(sys_root, 1)
    intel = sys_root / "class/drm/card0/device"
    intel.mkdir(parents=True)
    (intel / "vendor").write_text("0x8086\n")
    dev_root.mkdir()
    (dev_root / "kfd").write_text("")
    result = detect_amd(sys_root=sys_root, dev_root=dev_root, use_library=False)
    [gpu] = result.gpus
    assert (gpu.vendor, gpu.name, gpu.memory_total, gpu.memory_free) == (
        "amd",
        "AMD GPU 0x74a1",
        196592 * MiB,
        (196592 - 284) * MiB,
    )
    assert (gpu.utilization_pct, gpu.power_draw_w, gpu.power_limit_w, gpu.temperature_c) == (12.0, 140.0, 750.0, 41.0)
    assert gpu.rocm and gpu.device_id == "rocm:0"


def test_amd_without_kfd_is_an_error_with_the_fix(tmp_path: Path) -> None:
    _fake_amd_card(tmp_path, 0)
    result = detect_amd(sys_root=tmp_path, dev_root=tmp_path / "nodev", use_library=False)
    assert result.gpus and not result.gpus[0].rocm
    assert any("/dev/kfd is missing" in f.message for f in result.findings)


def test_amdsmi_import_keyerror_falls_back_to_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """amdsmi 7.0.2 raises KeyError('libamd_smi.so') at import without ROCm: a real import of such a module."""
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "amdsmi.py").write_text("raise KeyError('libamd_smi.so')\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    _fake_amd_card(tmp_path / "sys", 0)
    result = detect_amd(sys_root=tmp_path / "sys", dev_root=tmp_path)
    assert len(result.gpus) == 1
    assert any("amdsmi unavailable (KeyError)" in f.message for f in result.findings)


def test_amdsmi_library_path(tmp_path: Path) -> None:
    class FakeAmdSmi:
        def amdsmi_init(self) -> None: ...
        def amdsmi_shut_down(self) -> None: ...
        def amdsmi_get_processor_handles(self) -> list[str]:
            return ["h0"]

        def amdsmi_get_gpu_asic_info(self, h: str) -> dict:
            return {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"}

        def amdsmi_get_gpu_vram_usage(self, h: str) -> dict:
            return {"vram_total": 196592, "vram_used": 284}

        def amdsmi_get_gpu_activity(self, h: str) -> dict:
            return {"gfx_activity": 3}

        def amdsmi_get_power_info(self, h: str) -> dict:
            return {"current_socket_power": 140, "power_limit": 750}

        def amdsmi_get_gpu_device_uuid(self, h: str) -> str:
            return "uuid-0"

    _fake_amd_card(tmp_path, 0)
    (tmp_path / "kfd").write_text("")
    [gpu] = detect_amd(FakeAmdSmi(), sys_root=tmp_path, dev_root=tmp_path).gpus
    assert (gpu.name, gpu.compute_capability, gpu.memory_total, gpu.uuid) == (
        "AMD Instinct MI300X",
        "gfx942",
        196592 * MiB,
        "uuid-0",
    )
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.utilization_pct) == (140.0, 750.0, 3.0)


def test_no_amd_device_means_no_findings(tmp_path: Path) -> None:
    result = detect_amd(sys_root=tmp_path, dev_root=tmp_path)
    assert result.gpus == [] and result.findings == []


# --------------------------------------------------------------------------- CPU
CPUINFO = """processor\t: 0
physical id\t: 0
core id\t\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile amx_int8
processor\t: 1
physical id\t: 0
core id\t\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile amx_int8
processor\t: 2
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu
"""


def test_parse_cpuinfo_counts_physical_cores() -> None:
    model, flags, cores = parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Processor"
    assert {"avx2", "avx512f", "amx_int8"} <= flags
    assert cores == 2


def test_cpu_detector_on_a_fake_tree(tmp_path: Path) -> None:
    proc, sysr = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "cpuinfo").write_text(CPUINFO.replace(" avx2", ""))
    (proc / "self/cgroup").write_text("0::/appliance.slice\n")
    (sysr / "fs/cgroup/appliance.slice").mkdir(parents=True)
    (sysr / "fs/cgroup/appliance.slice/memory.max").write_text(str(4 * 2**30) + "\n")
    for n in (0, 1):
        (sysr / f"devices/system/node/node{n}").mkdir(parents=True)
    cpu, findings = detect_cpu(proc, sysr)
    assert cpu.numa_nodes == 2 and "avx2" not in cpu.flags and cpu.avx512
    assert cpu.memory_total == 4 * 2**30 and cpu.memory_available <= 4 * 2**30
    messages = " ".join(f.message for f in findings)
    if cpu.arch == "x86_64":
        assert "lacks AVX2" in messages
    assert "limited by the cgroup to 4.0 GiB" in messages


def test_cgroup_unlimited_is_none(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self/cgroup").write_text("4:memory:/x\n")
    (tmp_path / "fs/cgroup/memory/x").mkdir(parents=True)
    (tmp_path / "fs/cgroup/memory/x/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit(tmp_path, tmp_path) is None


def test_detect_hardware_on_this_box_tells_the_truth() -> None:
    snap = detect_hardware()
    cpu_text = Path("/proc/cpuinfo").read_text()
    assert snap.gpus == ()  # this box has no GPU
    assert snap.cpu.avx2 == (" avx2" in cpu_text)
    assert snap.cpu.physical_cores >= 1 and snap.cpu.memory_total > snap.cpu.memory_available > 0
    assert any(f.component == "nvidia" for f in snap.findings)


def test_a_crashing_detector_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    import appliance.hardware.detect as detect

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("driver mismatch")

    monkeypatch.setattr(detect, "detect_nvidia", boom)
    monkeypatch.setattr(detect, "detect_cpu", boom)
    snap = detect.detect_hardware()
    messages = [f.message for f in snap.findings]
    assert "nvidia detector failed: RuntimeError: driver mismatch" in messages
    assert "cpu detector failed: RuntimeError: driver mismatch" in messages


# --------------------------------------------------------------------------- snapshots, software
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_snapshot_json_round_trip(path: Path) -> None:
    snap = HardwareSnapshot.from_json(path.read_text())
    again = HardwareSnapshot.from_json(snap.to_json())
    assert again == snap
    assert json.loads(snap.to_json()) == json.loads(again.to_json())


def test_live_snapshot_round_trips() -> None:
    snap = detect_hardware()
    assert HardwareSnapshot.from_dict(json.loads(snap.to_json())) == snap


def test_software_findings_for_a_cpu_only_llamacpp_beside_gpus() -> None:
    snap = HardwareSnapshot.from_json((FIXTURES / "nvidia_l4_24g.json").read_text())
    findings = software_findings(SoftwareInfo("0.3.36", (), False), snap)
    errors = [f for f in findings if f.severity == "error"]
    assert errors and "--rebuild-engine" in (errors[0].fix or "")
    assert any(f.component == "vllm" and f.severity == "warning" for f in findings)
