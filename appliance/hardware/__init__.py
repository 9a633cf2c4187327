"""Hardware detection: CPU, NVIDIA (NVML), AMD (amdsmi or sysfs), and inference software.

``detect_hardware()`` returns a frozen :class:`HardwareSnapshot`; it never
raises, problems are :class:`Finding` rows with their fix.
"""

from appliance.hardware.detect import detect_hardware
from appliance.hardware.snapshot import CpuInfo, Finding, GpuInfo, HardwareSnapshot
from appliance.hardware.software import SoftwareInfo, detect_software, software_findings

__all__ = [
    "CpuInfo",
    "Finding",
    "GpuInfo",
    "HardwareSnapshot",
    "SoftwareInfo",
    "detect_hardware",
    "detect_software",
    "software_findings",
]
