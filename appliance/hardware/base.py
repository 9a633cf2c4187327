"""The detector contract shared by the NVIDIA and AMD detectors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from appliance.hardware.snapshot import Finding, GpuInfo


@dataclass
class DetectorResult:
    """What one GPU detector found: devices, findings and runtime versions."""

    gpus: list[GpuInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    driver_version: str | None = None
    runtime_version: str | None = None


def pci_devices(sys_root: Path, vendor: str) -> list[str]:
    """PCI addresses of display-class devices from ``vendor`` (``0x10de``, ``0x1002``)."""
    found = []
    try:
        entries = sorted((sys_root / "bus/pci/devices").iterdir())
    except OSError:
        return []
    for dev in entries:
        try:
            if (dev / "vendor").read_text().strip() != vendor:
                continue
            if not (dev / "class").read_text().strip().startswith("0x03"):
                continue
        except OSError:
            continue
        found.append(dev.name)
    return found


def unusable_device_nodes(paths: list[Path]) -> list[Path]:
    """Device nodes that exist but this process may not open read-write."""
    return [p for p in paths if p.exists() and not os.access(p, os.R_OK | os.W_OK)]
