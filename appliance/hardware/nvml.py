"""One NVML session for the process (the ``nvidia-ml-py`` package, module ``pynvml``).

NVML pairs every ``nvmlInit`` with an ``nvmlShutdown``. The appliance initialises
it once, on first use, and shuts it down when the process exits: detection
(:mod:`appliance.hardware.nvidia`), telemetry, the energy meter and calibration
all read through :data:`SESSION`. Device handles are looked up by index once and
kept while the session is open. A failed start raises
:class:`~appliance.hardware.errors.NvmlUnavailable` and is tried again on the next
use, so a driver loaded later is picked up. A library handed in by a caller (a
stand-in in tests) gets a session of its own, shut when the caller's block ends
(:func:`session_for`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

from appliance.hardware.errors import NvmlInitFailed, NvmlNotImportable

T = TypeVar("T")

NvmlHandle: TypeAlias = object
"""An opaque device handle (a ctypes pointer in pynvml)."""


class MemoryInfo(Protocol):
    total: int
    free: int
    used: int


class Utilization(Protocol):
    gpu: int


class ProcessInfo(Protocol):
    pid: int
    usedGpuMemory: int | None


class NvmlModule(Protocol):
    """The part of ``pynvml`` the appliance calls."""

    NVMLError: type[Exception]
    NVML_TEMPERATURE_GPU: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> NvmlHandle: ...
    def nvmlDeviceGetName(self, handle: NvmlHandle) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: NvmlHandle) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: NvmlHandle) -> MemoryInfo: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: NvmlHandle) -> tuple[int, int]: ...
    def nvmlDeviceGetUtilizationRates(self, handle: NvmlHandle) -> Utilization: ...
    def nvmlDeviceGetPowerUsage(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: NvmlHandle, sensor: int) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: NvmlHandle) -> tuple[int, int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: NvmlHandle, index: int) -> NvmlHandle: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: NvmlHandle) -> list[ProcessInfo]: ...


def text(value: str | bytes) -> str:
    """An NVML string: ``bytes`` from older pynvml releases, ``str`` from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Sensors:
    """What a device reports right now, in NVML's units; None where it does not support the field."""

    utilization_pct: int | None
    power_mw: int | None
    temperature_c: int | None


class NvmlSession:
    """NVML, initialised on first use and open until :meth:`close`; device handles by index."""

    def __init__(self, load: Callable[[], NvmlModule]):
        self._load = load
        self._lock = threading.Lock()
        self._nvml: NvmlModule | None = None
        self._handles: dict[int, NvmlHandle] = {}

    def open(self) -> NvmlModule:
        """The initialised library; raises NvmlNotImportable or NvmlInitFailed."""
        with self._lock:
            if self._nvml is None:
                module = self._load()
                try:
                    module.nvmlInit()
                except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, OSError from ctypes
                    raise NvmlInitFailed(exc) from exc
                self._nvml = module
            return self._nvml

    def close(self) -> None:
        """Shut NVML down (when it was started); the next use starts it again."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            self._handles.clear()
        if nvml is not None:
            with suppress(Exception):  # at exit nothing is left to tell
                nvml.nvmlShutdown()

    def count(self) -> int:
        return self.open().nvmlDeviceGetCount()

    def handle(self, index: int) -> NvmlHandle:
        """The handle of GPU ``index`` (NVML/PCI order), looked up once per session."""
        nvml = self.open()
        if index not in self._handles:
            self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def handles(self) -> list[NvmlHandle]:
        return [self.handle(i) for i in range(self.count())]

    def optional(self, read: Callable[..., T], *args: object) -> T | None:
        """``read(*args)``, or None when the device does not support that field."""
        nvml = self.open()
        try:
            return read(*args)
        except nvml.NVMLError:
            return None

    def sensors(self, handle: NvmlHandle) -> Sensors:
        nvml = self.open()
        util = self.optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        return Sensors(
            utilization_pct=util.gpu if util is not None else None,
            power_mw=self.optional(nvml.nvmlDeviceGetPowerUsage, handle),
            temperature_c=self.optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        )


def _import_pynvml() -> NvmlModule:
    try:
        import pynvml
    except Exception as exc:  # noqa: BLE001 - any import failure means no NVML
        raise NvmlNotImportable(exc) from exc
    return pynvml


SESSION = NvmlSession(_import_pynvml)
"""The process's NVML session, shut down at exit."""
atexit.register(SESSION.close)


@contextmanager
def session_for(nvml: NvmlModule | None) -> Iterator[NvmlSession]:
    """:data:`SESSION`, or for a library handed in a session of its own, shut when the block ends."""
    if nvml is None:
        yield SESSION
        return
    own = NvmlSession(lambda: nvml)
    try:
        yield own
    finally:
        own.close()
