"""Measured memory footprints of real loads, kept to correct later estimates.

After a load, the engine's footprint is measured (resident memory of its process
tree through psutil, plus its GPU memory through NVML's per-process accounting)
and stored in the ``calibrations`` table keyed (family:variant, backend,
context) beside the planner's *uncorrected* estimate. ``load_calibrations``
hands the rows to the pure planner as plain data; it corrects the next estimate
of the same variant and backend by (measured - estimated) of the nearest
context. ``calibration_report`` gives the estimation error of each row.

Decode speed is measured the same way: before an engine stops, the daemon reads
its counters of decode-only steps (:func:`decode_speed_from_stats`) and stores the
per-stream rate beside the planner's uncorrected estimate at that many streams
(:func:`record_decode_speed`); the planner scales its speed estimates by
measured over estimated (:func:`appliance.planner.speed.speed_correction`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlmodel import select

from appliance.db import engine as dbmod
from appliance.db.tables import Calibration, now
from appliance.hardware.nvml import NvmlModule, session_for
from appliance.jsontypes import JsonObject, JsonValue
from appliance.planner.types import CalibrationPoint, Plan

log = logging.getLogger("appliance.planner.calibration")


@dataclass(frozen=True)
class Footprint:
    """What an engine process tree uses: host resident bytes and GPU bytes (None: not measurable)."""

    rss_bytes: int
    gpu_bytes: int | None = None


def process_tree_pids(pid: int) -> list[int]:
    import psutil

    root = psutil.Process(pid)
    return [root.pid, *(c.pid for c in root.children(recursive=True))]


def rss_of(pids: Iterable[int]) -> int:
    """Resident set size of these processes together (gone ones count 0)."""
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def gpu_bytes_of(pids: Iterable[int], nvml: NvmlModule | None = None) -> int | None:
    """GPU memory NVML charges to these processes, summed over GPUs; None without NVML."""
    wanted = set(pids)
    with session_for(nvml) as session:
        try:
            lib = session.open()
            total = 0
            for handle in session.handles():
                for proc in lib.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in wanted and proc.usedGpuMemory:
                        total += int(proc.usedGpuMemory)
            return total
        except Exception:  # noqa: BLE001 - no library, no driver, a failed query: not measurable
            return None


def measure(pid: int, *, gpu: bool = False) -> Footprint:
    """Footprint of the engine whose root process is ``pid`` (GPU bytes only when ``gpu``)."""
    pids = process_tree_pids(pid)
    return Footprint(rss_of(pids), gpu_bytes_of(pids) if gpu else None)


def _uses_gpu(plan: Plan) -> bool:
    return any(d != "cpu" for d in plan.devices)


def record_load(engine: Engine, plan: Plan, rss_bytes: int | None, gpu_bytes: int | None = None) -> CalibrationPoint | None:
    """Store what a load of ``plan`` really used; returns the row as plain data, or None.

    The measurement must cover what the estimate covers: for a CPU plan the
    resident bytes alone; for a plan with GPUs the resident plus the GPU bytes,
    so without ``gpu_bytes`` a GPU plan is not recorded. A key already measured
    against the same estimate keeps the larger measurement (the footprint grows
    as pages are touched by traffic); a new estimate replaces the row.
    """
    if rss_bytes is None or rss_bytes <= 0:
        return None
    if _uses_gpu(plan):
        if gpu_bytes is None:
            return None
        measured = rss_bytes + gpu_bytes
    else:
        measured = rss_bytes
    estimated = plan.raw_estimated_bytes
    with dbmod.session(engine) as s:
        row = s.exec(
            select(Calibration).where(
                Calibration.variant_key == plan.model,
                Calibration.backend == plan.backend,
                Calibration.context == plan.context,
            )
        ).first()
        if row is None:
            row = Calibration(
                variant_key=plan.model,
                backend=plan.backend,
                context=plan.context,
                estimated_bytes=estimated,
                measured_bytes=measured,
            )
        elif row.estimated_bytes == estimated:
            row.measured_bytes = max(row.measured_bytes, measured)
            row.measured_at = now()
        else:
            row.estimated_bytes, row.measured_bytes, row.measured_at = estimated, measured, now()
        s.add(row)
        s.commit()
        point = _point(row)
    log.info(
        "calibration %s %s ctx=%d: estimated %d, measured %d (%+.1f%%)",
        point.variant_key,
        point.backend,
        point.context,
        point.estimated_bytes,
        point.measured_bytes,
        100 * estimation_error(point),
    )
    return point


MIN_DECODE_TOKENS = 64
"""Fewer decoded tokens than this say little about an engine's speed: not recorded."""


@dataclass(frozen=True)
class DecodeSpeed:
    """Measured decode rate of one stream while ``streams`` streams (on average) decoded together."""

    tokens_per_s: float
    streams: int


def decode_speed_from_stats(stats: dict[str, JsonValue]) -> DecodeSpeed | None:
    """The llama.cpp worker's ``/stats`` counters of decode-only steps, as a per-stream rate; None when too few."""
    tokens, ms, stream_ms = (
        stats.get(k) for k in ("decode_only_tokens_total", "decode_only_ms_total", "decode_only_stream_ms_total")
    )
    if not (isinstance(tokens, int) and isinstance(ms, int) and isinstance(stream_ms, int)):
        return None
    if tokens < MIN_DECODE_TOKENS or ms <= 0 or stream_ms <= 0:
        return None
    return DecodeSpeed(tokens / (stream_ms / 1000), max(1, round(stream_ms / ms)))


def record_decode_speed(engine: Engine, plan: Plan, speed: DecodeSpeed) -> CalibrationPoint | None:
    """Store a measured decode speed beside the plan's own estimate at that many streams.

    None when the plan has no estimate for that many streams. A variant never measured
    for memory gets a row whose memory fields are zero (:func:`load_calibrations` hands
    those to the planner without a memory correction).
    """
    if not plan.decode_curve or speed.streams > len(plan.decode_curve):
        return None
    estimated = plan.decode_curve[speed.streams - 1]
    with dbmod.session(engine) as s:
        row = s.exec(
            select(Calibration).where(
                Calibration.variant_key == plan.model,
                Calibration.backend == plan.backend,
                Calibration.context == plan.context,
            )
        ).first()
        if row is None:
            row = Calibration(
                variant_key=plan.model, backend=plan.backend, context=plan.context, estimated_bytes=0, measured_bytes=0
            )
        row.estimated_decode_tps, row.measured_decode_tps, row.decode_streams = estimated, speed.tokens_per_s, speed.streams
        s.add(row)
        s.commit()
        point = _point(row)
    log.info(
        "calibration %s %s: decode %.1f tok/s per stream at %d streams, estimated %.1f",
        plan.model,
        plan.backend,
        speed.tokens_per_s,
        speed.streams,
        estimated,
    )
    return point


def _point(r: Calibration) -> CalibrationPoint:
    return CalibrationPoint(
        r.variant_key,
        r.backend,
        r.context,
        r.estimated_bytes,
        r.measured_bytes,
        r.estimated_decode_tps,
        r.measured_decode_tps,
        r.decode_streams,
    )


def load_calibrations(engine: Engine) -> tuple[CalibrationPoint, ...]:
    """Every stored measurement, as the planner takes them."""
    with dbmod.session(engine) as s:
        rows = s.exec(select(Calibration)).all()
    return tuple(_point(r) for r in rows)


def estimation_error(point: CalibrationPoint) -> float:
    """(estimated - measured) / measured: negative when the planner under-estimated."""
    return (point.estimated_bytes - point.measured_bytes) / point.measured_bytes if point.measured_bytes else 0.0


def calibration_report(points: Iterable[CalibrationPoint]) -> list[JsonObject]:
    """Rows for people: key, backend, context, both sizes and the error in percent."""
    return [
        {
            "variant": p.variant_key,
            "backend": p.backend,
            "context": p.context,
            "estimated_bytes": p.estimated_bytes,
            "measured_bytes": p.measured_bytes,
            "error_pct": round(100 * estimation_error(p), 1),
            "decode_streams": p.decode_streams,
            "estimated_decode_tps": p.estimated_decode_tps,
            "measured_decode_tps": p.measured_decode_tps,
        }
        for p in sorted(points, key=lambda p: (p.variant_key, p.backend, p.context))
    ]
