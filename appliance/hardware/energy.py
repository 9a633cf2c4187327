"""Energy per request, from the hardware's own energy counters, or unknown.

Sources, first that works:

* ``nvml`` — ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver
  loaded), summed over every NVIDIA GPU; used only when *all* GPUs report it.
  It measures the accelerators, which is where the engines run on such boxes.
* ``rapl`` — ``/sys/class/powercap/intel-rapl:N/energy_uj`` of each CPU package
  (the top-level zones only: sub-zones are parts of them), with counter wrap-around
  handled through ``max_energy_range_uj``. Many kernels make these files
  root-only; then this source is simply unavailable.
* none — :meth:`EnergyMeter.read_joules` returns None and requests record no
  energy. A number is never invented.

Attribution to concurrent requests (:meth:`begin` / :meth:`end`): the counter is
read whenever a request starts or ends, which cuts time into segments during
which the set of active requests is constant. Each segment's energy is split
equally among the requests active in it (processor sharing), kept as one running
"energy per active request" sum, so a request's energy is that sum at its end
minus at its start. The request energies add up to what the hardware used while
at least one request was active — idle and static power in those segments
included, idle time between requests excluded. Requests shorter than the counter's
update period (NVML refreshes it every few tens of milliseconds) may read 0.
(Taking ``read_joules()`` at a request's start and end instead would charge every
concurrent request the whole interval's energy: N requests, N times the energy.)
Call :meth:`end` for every :meth:`begin` (in a ``finally``), or the active count
stays high and later requests are undercharged.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from appliance.hardware.nvml import SESSION, NvmlSession

log = logging.getLogger("appliance.hardware.energy")

RAPL_ROOT = Path("/sys/class/powercap")


class _Reader(Protocol):
    def read(self) -> float:
        """Joules since an arbitrary origin."""
        ...


class _Nvml:
    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._handles = session.handles()
        if not self._handles:
            raise RuntimeError("no NVIDIA GPU")
        self.read()  # raises NVMLError_NotSupported on GPUs without the counter

    def read(self) -> float:
        nvml = self._session.open()
        return sum(nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles) / 1000.0


@dataclass(slots=True)
class _RaplZone:
    """One package zone's counter: its file, wrap range, last raw value and accumulated µJ."""

    path: Path
    wrap: int
    last: int
    accumulated: int = 0


class _Rapl:
    def __init__(self, root: Path):
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise RuntimeError("no RAPL package zones")
        self._zones: list[_RaplZone] = []
        for zone in zones:
            energy = zone / "energy_uj"
            raw = int(energy.read_text())  # PermissionError when root-only
            try:
                wrap = int((zone / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                wrap = 0
            self._zones.append(_RaplZone(energy, wrap, raw))
        self._lock = threading.Lock()

    def read(self) -> float:
        with self._lock:
            total = 0
            for zone in self._zones:
                raw = int(zone.path.read_text())
                delta = raw - zone.last
                if delta < 0:  # the counter wrapped
                    delta += zone.wrap
                zone.last, zone.accumulated = raw, zone.accumulated + max(delta, 0)
                total += zone.accumulated
            return total / 1e6


@dataclass(frozen=True, slots=True)
class EnergyMark:
    """Taken at a request's start; hand it back to :meth:`EnergyMeter.end`."""

    share: float | None


class EnergyMeter:
    """Reads the box's energy counter and apportions it to requests."""

    def __init__(self, *, use_nvml: bool = True, rapl_root: Path = RAPL_ROOT):
        self.source: str | None = None
        self._reader: _Reader | None = None
        if use_nvml:
            try:
                self._reader, self.source = _Nvml(SESSION), "nvml"
            except Exception as exc:  # no library, no driver, no GPU, or no energy counter
                log.debug("NVML energy counter unavailable: %s", exc)
        if self._reader is None:
            try:
                self._reader, self.source = _Rapl(rapl_root), "rapl"
            except Exception as exc:
                log.debug("RAPL energy counter unavailable: %s", exc)
        self._lock = threading.Lock()
        self._active = 0
        self._share = 0.0  # running sum of segment energy / active requests
        self._last: float | None = None

    def read_joules(self) -> float | None:
        """Joules used since an arbitrary origin (monotonic), or None when unknown."""
        if self._reader is None:
            return None
        try:
            return self._reader.read()
        except Exception as exc:
            log.warning("energy counter read failed, disabling it: %s", exc)
            self._reader, self.source = None, None
            return None

    def _advance(self) -> bool:
        joules = self.read_joules()
        if joules is None:
            return False
        if self._last is not None and self._active > 0:
            self._share += max(joules - self._last, 0.0) / self._active
        self._last = joules
        return True

    def begin(self) -> EnergyMark:
        """A request starts."""
        with self._lock:
            known = self._advance()
            self._active += 1
            return EnergyMark(self._share if known else None)

    def end(self, mark: EnergyMark) -> float | None:
        """A request ends: the energy attributed to it, in joules, or None when unknown."""
        with self._lock:
            known = self._advance()
            self._active = max(self._active - 1, 0)
            if not known or mark.share is None:
                return None
            return self._share - mark.share
