"""NVIDIA detection through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

Never raises: a missing library, an unloaded driver or a permission problem
becomes a :class:`Finding` with the fix. ``nvml`` is injectable for tests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from appliance.hardware.base import DetectorResult, pci_devices, unusable_device_nodes
from appliance.hardware.snapshot import Finding, GpuInfo

NVIDIA_PCI_VENDOR = "0x10de"
DRIVER_FIX = "install the NVIDIA driver (e.g. `apt install nvidia-driver` or the .run installer) and reboot"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt(nvml: Any, fn: Callable[[], Any]) -> Any:
    """Call an NVML getter; unsupported fields give None instead of failing the device."""
    try:
        return fn()
    except nvml.NVMLError:
        return None


def _init_failure(nvml: Any, exc: Exception, present: int) -> Finding:
    name = type(exc).__name__
    where = f"{present} NVIDIA GPU(s) on the PCI bus" if present else "no NVIDIA GPU on the PCI bus"
    if "LibraryNotFound" in name:
        if present:
            return Finding("nvidia", "error", f"NVML library (libnvidia-ml.so) not found, yet {where}", DRIVER_FIX)
        return Finding("nvidia", "info", f"no NVIDIA driver (NVML library not found); {where}")
    if "DriverNotLoaded" in name:
        return Finding("nvidia", "error", f"NVIDIA kernel driver is not loaded; {where}", "load it with `modprobe nvidia` (or reinstall the driver and reboot)")
    if "NoPermission" in name:
        return Finding("nvidia", "error", "no permission to open /dev/nvidia*", "add the appliance user to the group owning /dev/nvidia* (usually `video`) and allow the devices in the unit (DeviceAllow=)")
    return Finding("nvidia", "error", f"NVML failed to start: {exc}", DRIVER_FIX)


def _device(nvml: Any, handle: Any, index: int, *, mig_enabled: bool, mig_instance: bool, name: str | None = None) -> GpuInfo:
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    cc = _opt(nvml, lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    util = _opt(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    power = _opt(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit = _opt(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    temp = _opt(nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    return GpuInfo(
        index=index,
        vendor="nvidia",
        name=name or _text(nvml.nvmlDeviceGetName(handle)),
        uuid=_opt(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        memory_total=int(mem.total),
        memory_free=int(mem.free),
        memory_used=int(mem.used),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        utilization_pct=float(util.gpu) if util is not None else None,
        temperature_c=float(temp) if temp is not None else None,
        power_draw_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        mig_enabled=mig_enabled,
        mig_instance=mig_instance,
    )


def _mig_instances(nvml: Any, handle: Any, parent: GpuInfo) -> list[GpuInfo]:
    out = []
    count = _opt(nvml, lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
    for i in range(count):
        mig = _opt(nvml, lambda i=i: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        if mig is None:
            continue
        info = _device(nvml, mig, parent.index, mig_enabled=True, mig_instance=True, name=f"{parent.name} MIG {i}")
        out.append(replace(info, compute_capability=parent.compute_capability, mig_slot=i))
    return out


def detect_nvidia(nvml: Any | None = None, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> DetectorResult:
    """List NVIDIA GPUs (MIG instances as separate entries) with findings; never raises."""
    result = DetectorResult()
    present = len(pci_devices(sys_root, NVIDIA_PCI_VENDOR))
    blocked = unusable_device_nodes(sorted(dev_root.glob("nvidia*")))
    if blocked:
        result.findings.append(Finding(
            "nvidia", "error", f"no read-write access to {', '.join(p.name for p in blocked)}",
            "add the appliance user to the group owning the device nodes (usually `video`)",
        ))
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except Exception as exc:  # noqa: BLE001 - any import failure is a finding
            sev = "error" if present else "info"
            result.findings.append(Finding("nvidia", sev, f"nvidia-ml-py is not importable ({type(exc).__name__})", "pip install nvidia-ml-py"))
            return result
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, OSError from ctypes
        result.findings.append(_init_failure(nvml, exc, present))
        return result
    try:
        result.driver_version = _opt(nvml, lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _opt(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        if cuda:
            result.runtime_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mode = _opt(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle))
                mig = bool(mode and mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
                gpu = _device(nvml, handle, i, mig_enabled=mig, mig_instance=False)
            except Exception as exc:  # noqa: BLE001 - one bad device must not hide the others
                result.findings.append(Finding("nvidia", "error", f"GPU {i} could not be read: {exc}"))
                continue
            if mig:
                instances = _mig_instances(nvml, handle, gpu)
                result.gpus.extend(instances)
                result.findings.append(Finding(
                    "nvidia", "info", f"GPU {i} ({gpu.name}) is in MIG mode: {len(instances)} instance(s) listed, each usable on its own",
                ))
            else:
                result.gpus.append(gpu)
    except Exception as exc:  # noqa: BLE001
        result.findings.append(Finding("nvidia", "error", f"NVML query failed: {exc}"))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return result
