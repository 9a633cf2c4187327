"""Prometheus metrics, in the text exposition format (version 0.0.4), without a client library.

The gateway calls :meth:`Metrics.observe_request` once per request, whatever its
outcome (the meter does not, so nothing is counted twice): a few dict updates
under a lock. The meter adds quota refusals by dimension. Gauges that belong to other parts (queue depth, loaded instances,
KV slots) are *pulled* at scrape time from callables registered with
:meth:`Metrics.set_gauge_source`, so their owners need not push anything.
Telemetry samples (:func:`appliance.hardware.telemetry.sample_telemetry`) go into a small
ring buffer the console charts, and the newest one is exposed as gauges.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from appliance.jsontypes import JsonObject

log = logging.getLogger("appliance.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
TELEMETRY_SAMPLES = 720  # an hour at one sample per 5 s

# Help for the gauges the router is expected to feed; others may be registered too.
KNOWN_GAUGES = {
    "appliance_queue_depth": ("Requests waiting for an engine slot.", ("model",)),
    "appliance_loaded_instances": ("Engine instances loaded.", ()),
    "appliance_kv_slots_in_use": ("Engine sequence (KV) slots in use.", ("model",)),
    "appliance_kv_slots_total": ("Engine sequence (KV) slots available.", ("model",)),
}

# Telemetry sample field -> (metric, help); per-GPU fields get a `gpu` label.
_HOST_GAUGES = {
    "cpu_percent": ("appliance_cpu_utilization_percent", "Host CPU utilization."),
    "memory_used_bytes": ("appliance_memory_used_bytes", "Host memory in use."),
    "memory_total_bytes": ("appliance_memory_total_bytes", "Host memory installed."),
}
_GPU_GAUGES = {
    "utilization_percent": ("appliance_gpu_utilization_percent", "Accelerator utilization."),
    "memory_used_bytes": ("appliance_gpu_memory_used_bytes", "Accelerator memory in use."),
    "memory_total_bytes": ("appliance_gpu_memory_total_bytes", "Accelerator memory installed."),
    "power_watts": ("appliance_gpu_power_watts", "Accelerator power draw."),
    "temperature_celsius": ("appliance_gpu_temperature_celsius", "Accelerator temperature."),
}

#: What a gauge source returns: one number, numbers by label value (a string for one label, a tuple for
#: several), or None when there is nothing to report.
#: Label values of one series, in the order of its label names.
Labels: TypeAlias = tuple[str, ...]
GaugeValue: TypeAlias = float | Mapping[str, float] | Mapping[tuple[str, ...], float] | None
GaugeSource: TypeAlias = Callable[[], GaugeValue]


class TelemetryProbe(Protocol):
    """Reads the accelerators for a telemetry sample (see :mod:`appliance.hardware.telemetry`)."""

    def sample(self) -> list[JsonObject]: ...


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Iterable[str], values: Iterable[object]) -> str:
    # A gauge source's key is its own business: a short one leaves labels off rather than failing the scrape.
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=False))
    return "{" + pairs + "}" if pairs else ""


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass(slots=True)
class _Series:
    counts: list[int]  # per bucket, then the overflow
    total: float = 0.0
    count: int = 0


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.series: dict[Labels, _Series] = {}

    def observe(self, labels: Labels, value: float) -> None:
        entry = self.series.get(labels)
        if entry is None:
            entry = self.series[labels] = _Series([0] * (len(self.buckets) + 1))
        entry.counts[bisect.bisect_left(self.buckets, value)] += 1
        entry.total += value
        entry.count += 1

    def render(self, name: str, help_: str, label_names: tuple[str, ...]) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for labels, series in sorted(self.series.items(), key=lambda item: item[0]):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), series.counts, strict=True):
                running += n
                lines.append(f"{name}_bucket{_labels((*label_names, 'le'), (*labels, _num(bound)))} {running}")
            lines.append(f"{name}_sum{_labels(label_names, labels)} {_num(series.total)}")
            lines.append(f"{name}_count{_labels(label_names, labels)} {series.count}")
        return lines


class Metrics:
    """Counters, histograms, pulled gauges and the telemetry ring buffer."""

    def __init__(self, telemetry_samples: int = TELEMETRY_SAMPLES):
        self._lock = threading.Lock()
        self._requests: dict[Labels, int] = defaultdict(int)  # (model, status, cache_tier)
        self._tokens: dict[Labels, int] = defaultdict(int)  # (model, kind)
        self._refusals: dict[Labels, int] = defaultdict(int)  # (model, dimension)
        self._cache: dict[Labels, int] = defaultdict(int)  # (result,)
        self._energy: dict[Labels, float] = defaultdict(float)  # (model,)
        self._prefix: dict[Labels, int] = defaultdict(int)  # (model, asked|reused): engine prompt tokens, and those its KV held
        self._ttft = _Histogram(TTFT_BUCKETS)
        self._latency = _Histogram(LATENCY_BUCKETS)
        self._overhead = _Histogram(OVERHEAD_BUCKETS)
        self._sources: dict[str, tuple[str, tuple[str, ...], GaugeSource]] = {}
        self._telemetry: deque[JsonObject] = deque(maxlen=telemetry_samples)
        self.telemetry_probe: TelemetryProbe | None = None  # set by appliance.hardware.telemetry on first sample

    # -- what the gateway and the meter call ---------------------------------------
    def observe_request(
        self,
        model: str,
        status: int,
        ttft_ms: float | None,
        latency_ms: float | None,
        prompt_tokens: int,
        completion_tokens: int,
        cache_tier: str = "miss",
        energy_joules: float | None = None,
        cached_tokens: int = 0,
    ) -> None:
        """Count one answered request; ``cached_tokens`` are the prompt tokens the engine's prefix cache reused."""
        with self._lock:
            self._requests[(model, str(status), cache_tier)] += 1
            if prompt_tokens:
                self._tokens[(model, "prompt")] += prompt_tokens
            if completion_tokens:
                self._tokens[(model, "completion")] += completion_tokens
            if cache_tier == "miss":
                self._cache[("miss",)] += 1
            elif cache_tier in ("exact", "semantic"):
                self._cache[(cache_tier,)] += 1
            source = "cache" if cache_tier in ("exact", "semantic") else "engine"  # hits would flatter the engine's percentiles
            if ttft_ms is not None:
                self._ttft.observe((model, source), ttft_ms / 1000.0)
            if latency_ms is not None:
                self._latency.observe((model, source), latency_ms / 1000.0)
            if energy_joules is not None:
                self._energy[(model,)] += energy_joules
            if cache_tier == "miss" and prompt_tokens:  # the engine read this prompt (a cache tier answered none)
                self._prefix[(model, "asked")] += prompt_tokens
                self._prefix[(model, "reused")] += min(cached_tokens, prompt_tokens)

    def observe_overhead(self, endpoint: str, seconds: float) -> None:
        """The daemon's own time for one served request: its latency less the time spent waiting for the engine."""
        with self._lock:
            self._overhead.observe((endpoint,), seconds)

    def observe_refusal(self, model: str, dimension: str) -> None:
        with self._lock:
            self._refusals[(model, dimension)] += 1

    def set_gauge_source(
        self, name: str, source: GaugeSource, *, help: str | None = None, labels: tuple[str, ...] | None = None
    ) -> None:
        """Register a callable read at every scrape.

        It returns a number, or a mapping from label values (a string for one label,
        a tuple for several) to numbers, or None (nothing to report). ``name`` gets the
        ``appliance_`` prefix if it lacks it; the known gauges (queue_depth,
        loaded_instances, kv_slots_in_use, kv_slots_total) come with help and labels.
        """
        full = name if name.startswith("appliance_") else f"appliance_{name}"
        known_help, known_labels = KNOWN_GAUGES.get(full, (f"{full} (gauge).", ()))
        self._sources[full] = (help or known_help, tuple(labels if labels is not None else known_labels), source)

    # -- telemetry ----------------------------------------------------------------
    def record_telemetry(self, sample: JsonObject) -> None:
        self._telemetry.append(sample)

    def telemetry_history(self) -> list[JsonObject]:
        """Telemetry samples, oldest first (each: t, cpu_percent, memory_*_bytes, gpus: [...])."""
        return list(self._telemetry)

    # -- exposition -------------------------------------------------------------------
    def render(self) -> str:
        with self._lock:
            requests = dict(self._requests)
            tokens = dict(self._tokens)
            refusals = dict(self._refusals)
            cache = dict(self._cache)
            energy = dict(self._energy)
            prefix = dict(self._prefix)
            lines = self._counter(
                "appliance_requests_total",
                "Requests answered, by model, HTTP status and cache tier.",
                ("model", "status", "cache_tier"),
                requests,
            )
            lines += self._counter(
                "appliance_tokens_total", "Tokens processed, by model and kind (prompt or completion).", ("model", "kind"), tokens
            )
            lines += self._counter(
                "appliance_quota_refusals_total",
                "Requests refused by a quota, by model and dimension.",
                ("model", "dimension"),
                refusals,
            )
            lines += self._counter(
                "appliance_cache_hits_total",
                "Requests answered from the response cache, by tier.",
                ("tier",),
                {k: v for k, v in cache.items() if k != ("miss",)},
            )
            lines += self._counter(
                "appliance_cache_misses_total", "Requests the response cache could not answer.", (), {(): cache.get(("miss",), 0)}
            )
            lines += self._counter(
                "appliance_energy_joules_total", "Energy attributed to requests, by model.", ("model",), energy
            )
            lines += self._counter(
                "appliance_prefix_cache_tokens_total",
                "Prompt tokens the engines were asked to read (kind=asked) and those whose KV a slot already held (kind=reused); "
                "the prefix cache hit rate is reused / asked.",
                ("model", "kind"),
                prefix,
            )
            lines += self._ttft.render(
                "appliance_ttft_seconds", "Time to first token (source: engine or cache).", ("model", "source")
            )
            lines += self._latency.render(
                "appliance_request_latency_seconds",
                "Request latency, admission to last byte (source: engine or cache).",
                ("model", "source"),
            )
            lines += self._overhead.render(
                "appliance_gateway_overhead_seconds",
                "Time the daemon spent on a request (arrival to last byte) less the time it waited for the engine, by endpoint.",
                ("endpoint",),
            )
        lines += self._pulled_gauges()
        lines += self._telemetry_gauges()
        return "\n".join(lines) + "\n"

    @staticmethod
    def _counter(name: str, help_: str, label_names: tuple[str, ...], values: Mapping[Labels, float]) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
        lines += [f"{name}{_labels(label_names, k)} {_num(v)}" for k, v in sorted(values.items())]
        return lines

    def _pulled_gauges(self) -> list[str]:
        lines: list[str] = []
        for name, (help_, label_names, source) in sorted(self._sources.items()):
            try:
                value = source()
            except Exception:
                log.debug("gauge source %s failed", name, exc_info=True)
                continue
            if value is None:
                continue
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
            if isinstance(value, Mapping):
                for key, v in sorted(value.items(), key=lambda kv: str(kv[0])):
                    key = key if isinstance(key, tuple) else (key,)
                    lines.append(f"{name}{_labels(label_names, key)} {_num(float(v))}")
            else:
                lines.append(f"{name} {_num(float(value))}")
        return lines

    def _telemetry_gauges(self) -> list[str]:
        if not self._telemetry:
            return []
        sample = self._telemetry[-1]
        lines: list[str] = []
        for field, (name, help_) in _HOST_GAUGES.items():
            if sample.get(field) is not None:
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {_num(float(sample[field]))}"]
        gpus = sample.get("gpus") or []
        for field, (name, help_) in _GPU_GAUGES.items():
            values = [(g["index"], g[field]) for g in gpus if g.get(field) is not None]
            if values:
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
                lines += [f'{name}{{gpu="{i}"}} {_num(float(v))}' for i, v in values]
        return lines
