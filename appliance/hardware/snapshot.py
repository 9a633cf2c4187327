"""Hardware snapshots: frozen dataclasses of what a box has, with a JSON round trip.

A :class:`HardwareSnapshot` is the planner's only view of the machine. Detectors
(:mod:`appliance.hardware.detect`) build one from the live box; tests and
``--snapshot`` load one from JSON (``tests/fixtures/hardware/*.json``).
Memory is in bytes everywhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from appliance.jsontypes import JsonObject


@dataclass(frozen=True)
class Finding:
    """Something a detector noticed: a missing driver, library, permission or feature.

    ``severity`` is ``info`` (expected on this box), ``warning`` (works, but less
    well) or ``error`` (hardware present that cannot be used). ``fix`` is the
    one-line remedy, when there is one.
    """

    component: str
    severity: str
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator (or one MIG instance of an NVIDIA GPU)."""

    index: int
    vendor: str
    """``nvidia`` or ``amd``."""
    name: str
    memory_total: int
    memory_free: int
    memory_used: int
    uuid: str | None = None
    compute_capability: str | None = None
    """NVIDIA ``major.minor`` (``8.9``); for AMD the gfx target (``gfx942``) when known."""
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    mig_enabled: bool = False
    """The parent GPU runs in MIG mode."""
    mig_instance: bool = False
    """This entry is one MIG instance (usable alone, never split across)."""
    mig_slot: int | None = None
    """MIG instance number on its parent GPU ``index``."""
    rocm: bool = False
    """AMD only: the ROCm runtime (/dev/kfd) is usable."""

    @property
    def device_id(self) -> str:
        """Id engines are pointed at: ``cuda:0``, ``cuda:MIG-…``, ``rocm:0``.

        Numeric ids are NVML/PCI order: drivers set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
        """
        prefix = "cuda" if self.vendor == "nvidia" else "rocm"
        if self.mig_instance and self.uuid:
            return f"{prefix}:{self.uuid}"
        return f"{prefix}:{self.index}"

    @property
    def label(self) -> str:
        """Short human name used in reasons: ``GPU0``, ``GPU0.MIG1``."""
        if self.mig_instance:
            return f"GPU{self.index}.MIG{self.mig_slot}"
        return f"GPU{self.index}"

    @property
    def cc_tuple(self) -> tuple[int, int] | None:
        """Compute capability as a tuple, NVIDIA only."""
        if self.vendor != "nvidia" or not self.compute_capability:
            return None
        try:
            major, minor = self.compute_capability.split(".", 1)
            return int(major), int(minor)
        except ValueError:
            return None


@dataclass(frozen=True)
class CpuInfo:
    """The host CPU and its memory."""

    model: str
    physical_cores: int
    threads: int
    memory_total: int
    memory_available: int
    numa_nodes: int = 1
    arch: str = "x86_64"
    flags: tuple[str, ...] = ()
    """The SIMD flags that matter to inference engines (avx2, avx512f, amx_int8, ...)."""
    memory_bandwidth: int | None = None
    """Bytes/s the cores read memory at, when measured (or given by a fixture); None: the planner
    estimates it from the core count (:mod:`appliance.planner.speed`)."""

    @property
    def avx2(self) -> bool:
        return "avx2" in self.flags

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags


@dataclass(frozen=True)
class HardwareSnapshot:
    """Everything the planner knows about one machine."""

    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...] = ()
    findings: tuple[Finding, ...] = ()
    hostname: str = "localhost"
    nvidia_driver: str | None = None
    cuda_version: str | None = None
    rocm_version: str | None = None
    taken_at: float = 0.0
    description: str = field(default="", compare=False)
    """Free text (fixtures say which real machine they came from)."""

    def to_dict(self) -> JsonObject:
        """Plain JSON-able dict (tuples become lists)."""
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: JsonObject) -> HardwareSnapshot:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        cpu = CpuInfo(**_known(CpuInfo, data["cpu"]))
        gpus = tuple(GpuInfo(**_known(GpuInfo, g)) for g in data.get("gpus", ()))
        findings = tuple(Finding(**_known(Finding, f)) for f in data.get("findings", ()))
        rest = {k: v for k, v in data.items() if k not in ("cpu", "gpus", "findings")}
        return cls(**_known(cls, rest), cpu=cpu, gpus=gpus, findings=findings)

    @classmethod
    def from_json(cls, text: str) -> HardwareSnapshot:
        return cls.from_dict(json.loads(text))


def _known(klass: type, data: JsonObject) -> JsonObject:
    """The fields of dataclass ``klass`` in ``data`` (lists as tuples); other keys are dropped."""
    known = {f.name for f in fields(klass)}
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known}
