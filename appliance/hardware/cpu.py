"""CPU and RAM detection: psutil, /proc/cpuinfo, /sys/devices/system/node, cgroup limits.

The roots are parameters so tests can point the detector at a fake tree.
"""

from __future__ import annotations

import platform
from pathlib import Path

import psutil

from appliance.hardware.snapshot import CpuInfo, Finding
from appliance.hardware.units import GiB

INTERESTING_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
)
NO_LIMIT = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpuinfo(text: str) -> tuple[str, set[str], int | None]:
    """(model name, all flags, physical core count or None) from /proc/cpuinfo text."""
    model = ""
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    physical = "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "Hardware") and not model:
            model = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            physical = value
        elif key == "core id":
            cores.add((physical, value))
    return model, flags, (len(cores) or None)


def cgroup_memory_limit(proc_root: Path, sys_root: Path) -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), or None when unlimited."""
    text = _read(proc_root / "self" / "cgroup") or ""
    candidates: list[Path] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            candidates.append(sys_root / "fs/cgroup" / parts[2].lstrip("/") / "memory.max")
        elif "memory" in parts[1].split(","):
            candidates.append(sys_root / "fs/cgroup/memory" / parts[2].lstrip("/") / "memory.limit_in_bytes")
    for path in candidates:
        value = (_read(path) or "").strip()
        if value.isdigit() and int(value) < NO_LIMIT:
            return int(value)
    return None


def numa_node_count(sys_root: Path) -> int:
    node_dir = sys_root / "devices/system/node"
    try:
        nodes = [p for p in node_dir.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError:
        return 1
    return max(1, len(nodes))


def detect_cpu(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> tuple[CpuInfo, list[Finding]]:
    """Describe the CPU and memory; findings report missing SIMD features and cgroup limits."""
    findings: list[Finding] = []
    model, flags, cpuinfo_cores = parse_cpuinfo(_read(proc_root / "cpuinfo") or "")
    threads = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or cpuinfo_cores or threads
    vm = psutil.virtual_memory()
    total, available = vm.total, vm.available
    limit = cgroup_memory_limit(proc_root, sys_root)
    if limit is not None and limit < total:
        findings.append(Finding("cpu", "info", f"memory is limited by the cgroup to {limit / GiB:.1f} GiB"))
        total, available = limit, min(available, limit)
    arch = platform.machine() or "unknown"
    kept = tuple(f for f in INTERESTING_FLAGS if f in flags)
    if arch in ("x86_64", "AMD64") and "avx2" not in flags:
        findings.append(
            Finding(
                "cpu",
                "warning",
                "CPU lacks AVX2: llama.cpp runs several times slower",
                "use a CPU with AVX2 (any x86-64 since 2013), or expose it to the VM (e.g. `-cpu host` in QEMU/KVM)",
            )
        )
    info = CpuInfo(
        model=model or platform.processor() or "unknown",
        physical_cores=physical,
        threads=threads,
        memory_total=total,
        memory_available=available,
        numa_nodes=numa_node_count(sys_root),
        arch=arch,
        flags=kept,
    )
    return info, findings
