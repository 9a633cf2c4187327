"""NVIDIA detection through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

Never raises: a missing library, an unloaded driver or a permission problem
becomes a :class:`Finding` with the fix. Reads through the process's NVML
session (:mod:`appliance.hardware.nvml`); ``nvml`` is injectable for tests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from appliance.hardware.base import DetectorResult, pci_devices, unusable_device_nodes
from appliance.hardware.errors import NvmlInitFailed, NvmlNotImportable
from appliance.hardware.nvml import NvmlHandle, NvmlModule, NvmlSession, session_for, text
from appliance.hardware.snapshot import Finding, GpuInfo

NVIDIA_PCI_VENDOR = "0x10de"
DRIVER_FIX = "install the NVIDIA driver (e.g. `apt install nvidia-driver` or the .run installer) and reboot"


def _init_failure(exc: BaseException, present: int) -> Finding:
    name = type(exc).__name__
    where = f"{present} NVIDIA GPU(s) on the PCI bus" if present else "no NVIDIA GPU on the PCI bus"
    if "LibraryNotFound" in name:
        if present:
            return Finding("nvidia", "error", f"NVML library (libnvidia-ml.so) not found, yet {where}", DRIVER_FIX)
        return Finding("nvidia", "info", f"no NVIDIA driver (NVML library not found); {where}")
    if "DriverNotLoaded" in name:
        return Finding(
            "nvidia",
            "error",
            f"NVIDIA kernel driver is not loaded; {where}",
            "load it with `modprobe nvidia` (or reinstall the driver and reboot)",
        )
    if "NoPermission" in name:
        return Finding(
            "nvidia",
            "error",
            "no permission to open /dev/nvidia*",
            "add the appliance user to the group owning /dev/nvidia* (usually `video`) and allow the devices in the unit "
            "(DeviceAllow=)",
        )
    return Finding("nvidia", "error", f"NVML failed to start: {exc}", DRIVER_FIX)


def _device(
    session: NvmlSession, handle: NvmlHandle, index: int, *, mig_enabled: bool, mig_instance: bool, name: str | None = None
) -> GpuInfo:
    nvml = session.open()
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    cc = session.optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    sensors = session.sensors(handle)
    limit = session.optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    uuid = session.optional(nvml.nvmlDeviceGetUUID, handle)
    return GpuInfo(
        index=index,
        vendor="nvidia",
        name=name or text(nvml.nvmlDeviceGetName(handle)),
        uuid=text(uuid) if uuid is not None else None,
        memory_total=int(mem.total),
        memory_free=int(mem.free),
        memory_used=int(mem.used),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        utilization_pct=float(sensors.utilization_pct) if sensors.utilization_pct is not None else None,
        temperature_c=float(sensors.temperature_c) if sensors.temperature_c is not None else None,
        power_draw_w=sensors.power_mw / 1000 if sensors.power_mw is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        mig_enabled=mig_enabled,
        mig_instance=mig_instance,
    )


def _mig_instances(session: NvmlSession, handle: NvmlHandle, parent: GpuInfo) -> list[GpuInfo]:
    nvml = session.open()
    out = []
    count = session.optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for i in range(count):
        mig = session.optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if mig is None:
            continue
        info = _device(session, mig, parent.index, mig_enabled=True, mig_instance=True, name=f"{parent.name} MIG {i}")
        out.append(replace(info, compute_capability=parent.compute_capability, mig_slot=i))
    return out


def _read_devices(session: NvmlSession, result: DetectorResult) -> None:
    """Driver and CUDA versions, then every GPU (MIG instances in place of their parent)."""
    nvml = session.open()
    driver = session.optional(nvml.nvmlSystemGetDriverVersion)
    result.driver_version = text(driver) if driver is not None else None
    cuda = session.optional(nvml.nvmlSystemGetCudaDriverVersion)
    if cuda:
        result.runtime_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
    for i in range(session.count()):
        try:
            handle = session.handle(i)
            mode = session.optional(nvml.nvmlDeviceGetMigMode, handle)
            mig = bool(mode and mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
            gpu = _device(session, handle, i, mig_enabled=mig, mig_instance=False)
        except Exception as exc:  # noqa: BLE001 - one bad device must not hide the others
            result.findings.append(Finding("nvidia", "error", f"GPU {i} could not be read: {exc}"))
            continue
        if mig:
            instances = _mig_instances(session, handle, gpu)
            result.gpus.extend(instances)
            result.findings.append(
                Finding(
                    "nvidia",
                    "info",
                    f"GPU {i} ({gpu.name}) is in MIG mode: {len(instances)} instance(s) listed, each usable on its own",
                )
            )
        else:
            result.gpus.append(gpu)


def detect_nvidia(nvml: NvmlModule | None = None, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> DetectorResult:
    """List NVIDIA GPUs (MIG instances as separate entries) with findings; never raises."""
    result = DetectorResult()
    present = len(pci_devices(sys_root, NVIDIA_PCI_VENDOR))
    blocked = unusable_device_nodes(sorted(dev_root.glob("nvidia*")))
    if blocked:
        result.findings.append(
            Finding(
                "nvidia",
                "error",
                f"no read-write access to {', '.join(p.name for p in blocked)}",
                "add the appliance user to the group owning the device nodes (usually `video`)",
            )
        )
    with session_for(nvml) as session:
        try:
            session.open()
        except NvmlNotImportable as exc:
            sev = "error" if present else "info"
            result.findings.append(
                Finding("nvidia", sev, f"nvidia-ml-py is not importable ({type(exc.cause).__name__})", "pip install nvidia-ml-py")
            )
            return result
        except NvmlInitFailed as exc:
            result.findings.append(_init_failure(exc.cause, present))
            return result
        try:
            _read_devices(session, result)
        except Exception as exc:  # noqa: BLE001
            result.findings.append(Finding("nvidia", "error", f"NVML query failed: {exc}"))
    return result
