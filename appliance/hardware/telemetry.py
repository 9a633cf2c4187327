"""Host and accelerator telemetry, sampled by a scheduled job into the metrics ring buffer.

Schedule ``sample_telemetry(metrics)`` every 5 seconds. A sample is a plain dict::

    {"t": 1717000000.0, "cpu_percent": 12.5, "memory_used_bytes": ..., "memory_total_bytes": ...,
     "gpus": [{"index": 0, "name": "...", "utilization_percent": 80, "memory_used_bytes": ...,
               "memory_total_bytes": ..., "power_watts": 250.1, "temperature_celsius": 61}]}

GPU fields come from NVML when the library and a driver are present; a field a
GPU does not support is None. Without NVML ``gpus`` is empty.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import psutil

from appliance.hardware.nvml import SESSION, NvmlSession, text
from appliance.jsontypes import JsonObject
from appliance.metrics import Metrics

log = logging.getLogger("appliance.hardware.telemetry")


class _Probe(Protocol):
    def sample(self) -> list[JsonObject]: ...


class _NvmlProbe:
    def __init__(self, session: NvmlSession) -> None:
        nvml = session.open()
        self.session = session
        self.handles = session.handles()
        self.names = [text(nvml.nvmlDeviceGetName(handle)) for handle in self.handles]

    def sample(self) -> list[JsonObject]:
        nvml = self.session.open()
        gpus = []
        for index, (handle, name) in enumerate(zip(self.handles, self.names, strict=True)):
            sensors = self.session.sensors(handle)
            mem = self.session.optional(nvml.nvmlDeviceGetMemoryInfo, handle)
            gpus.append(
                {
                    "index": index,
                    "name": name,
                    "utilization_percent": sensors.utilization_pct,
                    "memory_used_bytes": mem.used if mem is not None else None,
                    "memory_total_bytes": mem.total if mem is not None else None,
                    "power_watts": sensors.power_mw / 1000.0 if sensors.power_mw is not None else None,
                    "temperature_celsius": sensors.temperature_c,
                }
            )
        return gpus


class _NoGpu:
    def sample(self) -> list[JsonObject]:
        return []


def _probe(metrics: Metrics) -> _Probe:
    if metrics.telemetry_probe is None:
        try:
            metrics.telemetry_probe = _NvmlProbe(SESSION)
        except Exception as exc:  # no library or no driver: CPU only
            log.debug("no NVML telemetry: %s", exc)
            metrics.telemetry_probe = _NoGpu()
    return metrics.telemetry_probe


def sample_telemetry(metrics: Metrics) -> JsonObject:
    """Take one sample, append it to ``metrics``' ring buffer, and return it."""
    memory = psutil.virtual_memory()
    sample: JsonObject = {
        "t": time.time(),
        "cpu_percent": psutil.cpu_percent(interval=None),  # since the previous sample
        "memory_used_bytes": memory.total - memory.available,
        "memory_total_bytes": memory.total,
        "gpus": _probe(metrics).sample(),
    }
    metrics.record_telemetry(sample)
    return sample
