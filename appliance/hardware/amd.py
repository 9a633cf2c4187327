"""AMD detection: ``amdsmi`` when it imports, otherwise the amdgpu sysfs files.

``import amdsmi`` raises ``KeyError`` (not ImportError) on a box without ROCm,
so every failure of the library path is caught and the sysfs path taken. The
sysfs root is a parameter so tests can build a fake tree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeAlias, TypeVar

from appliance.hardware.base import DetectorResult, pci_devices
from appliance.hardware.snapshot import Finding, GpuInfo

AMD_PCI_VENDOR = "0x1002"
_CARD = re.compile(r"card(\d+)$")
T = TypeVar("T")

AmdHandle: TypeAlias = object
"""An opaque processor handle."""
AmdInfo: TypeAlias = dict[str, int | float | str]
"""One of amdsmi's info dicts (numbers, or strings such as ``N/A``)."""


class AmdSmi(Protocol):
    """The part of ``amdsmi`` the appliance calls (its temperature enums are looked up when present)."""

    def amdsmi_init(self) -> None: ...
    def amdsmi_shut_down(self) -> None: ...
    def amdsmi_get_processor_handles(self) -> list[AmdHandle]: ...
    def amdsmi_get_gpu_asic_info(self, handle: AmdHandle) -> AmdInfo: ...
    def amdsmi_get_gpu_vram_usage(self, handle: AmdHandle) -> AmdInfo: ...
    def amdsmi_get_gpu_activity(self, handle: AmdHandle) -> AmdInfo: ...
    def amdsmi_get_power_info(self, handle: AmdHandle) -> AmdInfo: ...
    def amdsmi_get_gpu_device_uuid(self, handle: AmdHandle) -> str: ...
    def amdsmi_get_temp_metric(self, handle: AmdHandle, sensor: object, metric: object) -> int: ...


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError):
        return None


def _read_str(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _hwmon(device: Path) -> Path | None:
    hw = sorted((device / "hwmon").glob("hwmon*")) if (device / "hwmon").is_dir() else []
    return hw[0] if hw else None


def _rocm_state(dev_root: Path) -> tuple[bool, Finding | None]:
    kfd = dev_root / "kfd"
    if not kfd.exists():
        return False, Finding(
            "amd",
            "error",
            "/dev/kfd is missing: the amdgpu kernel driver (KFD) is not loaded",
            "install the amdgpu-dkms driver and ROCm, then reboot",
        )
    if not os.access(kfd, os.R_OK | os.W_OK):
        return False, Finding(
            "amd",
            "error",
            "no read-write access to /dev/kfd and /dev/dri/renderD*",
            "add the appliance user to the `render` and `video` groups",
        )
    return True, None


def _card_number(path: Path) -> int | None:
    """N of a /sys/class/drm/cardN entry; None for the connectors (card0-DP-1) and render nodes."""
    found = _CARD.match(path.name)
    return int(found.group(1)) if found else None


def sysfs_gpus(sys_root: Path, rocm: bool) -> list[GpuInfo]:
    """AMD GPUs from /sys/class/drm/card*/device (vendor 0x1002, mem_info_vram_*)."""
    gpus: list[GpuInfo] = []
    drm = sys_root / "class/drm"
    try:
        numbered = [(number, p) for p in drm.iterdir() if (number := _card_number(p)) is not None]
    except OSError:
        return []
    for _, card in sorted(numbered, key=lambda item: item[0]):
        dev = card / "device"
        if _read_str(dev / "vendor") != AMD_PCI_VENDOR:
            continue
        total = _read_int(dev / "mem_info_vram_total")
        if total is None:
            continue
        used = _read_int(dev / "mem_info_vram_used") or 0
        hw = _hwmon(dev)
        power = _read_int(hw / "power1_average") if hw else None
        if power is None and hw:
            power = _read_int(hw / "power1_input")
        cap = _read_int(hw / "power1_cap") if hw else None
        temp = _read_int(hw / "temp1_input") if hw else None
        busy = _read_int(dev / "gpu_busy_percent")
        name = _read_str(dev / "product_name") or f"AMD GPU {_read_str(dev / 'device') or '?'}"
        gpus.append(
            GpuInfo(
                index=len(gpus),
                vendor="amd",
                name=name,
                uuid=_read_str(dev / "unique_id"),
                memory_total=total,
                memory_free=max(0, total - used),
                memory_used=used,
                utilization_pct=float(busy) if busy is not None else None,
                temperature_c=temp / 1000 if temp is not None else None,
                power_draw_w=power / 1e6 if power is not None else None,
                power_limit_w=cap / 1e6 if cap is not None else None,
                rocm=rocm,
            )
        )
    return gpus


def _call(fn: Callable[..., T], *args: object) -> T | None:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - amdsmi raises its own error types per field
        return None


def amdsmi_gpus(amdsmi: AmdSmi, rocm: bool) -> list[GpuInfo]:
    """AMD GPUs through the amdsmi library (already initialised)."""
    gpus = []
    for i, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
        asic = _call(amdsmi.amdsmi_get_gpu_asic_info, h) or {}
        vram = amdsmi.amdsmi_get_gpu_vram_usage(h)  # MiB
        total, used = int(vram["vram_total"]) << 20, int(vram["vram_used"]) << 20
        activity = _call(amdsmi.amdsmi_get_gpu_activity, h) or {}
        power = _call(amdsmi.amdsmi_get_power_info, h) or {}
        temp = None
        sensors = getattr(amdsmi, "AmdSmiTemperatureType", None)
        if sensors is not None:
            metrics = getattr(amdsmi, "AmdSmiTemperatureMetric")  # noqa: B009 - an enum the AmdSmi protocol does not declare
            temp = _call(amdsmi.amdsmi_get_temp_metric, h, sensors.HOTSPOT, metrics.CURRENT)
        draw = power.get("current_socket_power") or power.get("average_socket_power")
        target = asic.get("target_graphics_version")
        gpus.append(
            GpuInfo(
                index=i,
                vendor="amd",
                name=str(asic.get("market_name") or "AMD GPU"),
                uuid=_call(amdsmi.amdsmi_get_gpu_device_uuid, h),
                memory_total=total,
                memory_free=max(0, total - used),
                memory_used=used,
                compute_capability=str(target) if target is not None else None,
                utilization_pct=_num(activity.get("gfx_activity")),
                temperature_c=_num(temp),
                power_draw_w=_num(draw),
                power_limit_w=_num(power.get("power_limit")),
                rocm=rocm,
            )
        )
    return gpus


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def detect_amd(
    amdsmi: AmdSmi | None = None, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev"), *, use_library: bool = True
) -> DetectorResult:
    """List AMD GPUs with findings; never raises. ``amdsmi`` is injectable for tests."""
    result = DetectorResult()
    present = pci_devices(sys_root, AMD_PCI_VENDOR)
    drm_amd = any(_read_str(p / "device/vendor") == AMD_PCI_VENDOR for p in (sys_root / "class/drm").glob("card*"))
    if not present and not drm_amd:
        return result
    rocm, problem = _rocm_state(dev_root)
    if problem:
        result.findings.append(problem)
    version = _read_str(Path("/opt/rocm/.info/version"))
    result.runtime_version = version
    if use_library:
        try:
            if amdsmi is None:
                import amdsmi as installed  # raises KeyError without ROCm

                amdsmi = installed
            amdsmi.amdsmi_init()
            try:
                result.gpus = amdsmi_gpus(amdsmi, rocm)
            finally:
                _call(amdsmi.amdsmi_shut_down)
            return result
        except Exception as exc:  # noqa: BLE001 - KeyError, ImportError, AmdSmiException
            result.findings.append(Finding("amd", "info", f"amdsmi unavailable ({type(exc).__name__}); read the GPUs from sysfs"))
    result.gpus = sysfs_gpus(sys_root, rocm)
    if present and not result.gpus:
        result.findings.append(
            Finding(
                "amd",
                "error",
                f"{len(present)} AMD GPU(s) on the PCI bus but no amdgpu memory info",
                "install or load the amdgpu kernel driver",
            )
        )
    return result
