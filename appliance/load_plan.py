"""From a model name to a Plan for this box: store facts + live hardware + settings → the pure planner."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path
from typing import Any

from appliance.errors import DoesNotFit
from appliance.planner import plan
from appliance.planner_types import Plan, Preferences, Refusal, Variant

HARDWARE_TTL_S = 5.0
GiB = 2**30
_snapshot_cache: dict[str, Any] = {}


def hardware_snapshot() -> Any:
    """The live hardware snapshot, re-read at most every few seconds (free memory changes)."""
    from appliance.hardware.detect import detect_hardware

    cached = _snapshot_cache.get("snapshot")
    if cached is None or time.monotonic() - _snapshot_cache["at"] > HARDWARE_TTL_S:
        cached = detect_hardware()
        _snapshot_cache.update(snapshot=cached, at=time.monotonic())
    return cached


def vllm_available(settings: Any) -> bool:
    if settings.vllm_python is not None:
        return Path(settings.vllm_python).exists()
    return importlib.util.find_spec("vllm") is not None


def preferences(settings: Any) -> Preferences:
    return Preferences(
        min_context=settings.engine_context,
        parallel=settings.engine_parallel,
        memory_margin=int(settings.memory_margin_gib * GiB),
        vllm_available=vllm_available(settings),
        ray_address=settings.ray_address,
        backend=settings.backend,
        threads=settings.engine_threads,
        memory_budget=int(settings.memory_budget_gib * GiB) if settings.memory_budget_gib else None,
    )


def variant_for_planner(resolved: Any) -> Variant:
    facts = resolved.model_facts
    if facts is None:
        raise DoesNotFit(f"{resolved.name} has no architecture facts; re-import it so it can be inspected.")
    return Variant(family=resolved.family, name=resolved.variant, format=resolved.format, quantization=resolved.quantization,
                   size_bytes=resolved.size_bytes, facts=facts, path=str(resolved.file))


def plan_for_load(services: Any, name: str) -> Plan:
    """Plan the load of exactly this installed ``family:variant``; raise DoesNotFit with the reason."""
    resolved = services.store.resolve(name)
    calibrations = ()
    try:
        from appliance.calibration import load_calibrations

        calibrations = load_calibrations(services.db)
    except ImportError:
        pass
    result = plan(hardware_snapshot(), [variant_for_planner(resolved)], preferences(services.settings), calibrations)
    if isinstance(result, Refusal):
        needed = "; ".join(result.needed)
        raise DoesNotFit(f"{name} does not fit this box: {result.reason}" + (f" (needs: {needed})" if needed else ""))
    return dataclasses.replace(result, model=name, model_path=str(resolved.file))
