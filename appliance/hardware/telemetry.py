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
from typing import Any

import psutil

from appliance.metrics import Metrics

log = logging.getLogger("appliance.hardware.telemetry")


class _NvmlProbe:
    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.names = []
        for handle in self.handles:
            name = pynvml.nvmlDeviceGetName(handle)
            self.names.append(name.decode() if isinstance(name, bytes) else name)

    def _try(self, fn, *args) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self) -> list[dict]:
        nv = self.nvml
        gpus = []
        for index, (handle, name) in enumerate(zip(self.handles, self.names)):
            util = self._try(nv.nvmlDeviceGetUtilizationRates, handle)
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, handle)
            power = self._try(nv.nvmlDeviceGetPowerUsage, handle)  # milliwatts
            temp = self._try(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            gpus.append({
                "index": index,
                "name": name,
                "utilization_percent": util.gpu if util is not None else None,
                "memory_used_bytes": mem.used if mem is not None else None,
                "memory_total_bytes": mem.total if mem is not None else None,
                "power_watts": power / 1000.0 if power is not None else None,
                "temperature_celsius": temp,
            })
        return gpus


class _NoGpu:
    def sample(self) -> list[dict]:
        return []


def _probe(metrics: Metrics) -> Any:
    if metrics.telemetry_probe is None:
        try:
            metrics.telemetry_probe = _NvmlProbe()
        except Exception as exc:  # no library or no driver: CPU only
            log.debug("no NVML telemetry: %s", exc)
            metrics.telemetry_probe = _NoGpu()
    return metrics.telemetry_probe


def sample_telemetry(metrics: Metrics) -> dict:
    """Take one sample, append it to ``metrics``' ring buffer, and return it."""
    memory = psutil.virtual_memory()
    sample = {
        "t": time.time(),
        "cpu_percent": psutil.cpu_percent(interval=None),  # since the previous sample
        "memory_used_bytes": memory.total - memory.available,
        "memory_total_bytes": memory.total,
        "gpus": _probe(metrics).sample(),
    }
    metrics.record_telemetry(sample)
    return sample
