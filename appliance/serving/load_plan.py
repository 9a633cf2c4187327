"""From a model name to a Plan for this box: store facts + live hardware + settings → the pure planner."""

from __future__ import annotations

import dataclasses
from typing import Any

from appliance.planner.calibration import load_calibrations
from appliance.errors import DoesNotFit
from appliance.planner.plan import plan
from appliance.planner.types import Plan, Refusal, Variant
from appliance.planner.service import live_snapshot, preferences_for, software


def variant_for_planner(resolved: Any) -> Variant:
    facts = resolved.model_facts
    if facts is None:
        raise DoesNotFit(f"{resolved.name} has no architecture facts; re-import it so it can be inspected.")
    return Variant(family=resolved.family, name=resolved.variant, format=resolved.format, quantization=resolved.quantization,
                   size_bytes=resolved.size_bytes, facts=facts, path=str(resolved.file))


def plan_for_load(services: Any, name: str) -> Plan:
    """Plan the load of exactly this installed ``family:variant``; raise DoesNotFit with the reason."""
    resolved = services.store.resolve(name)
    settings = services.settings
    result = plan(live_snapshot(), [variant_for_planner(resolved)], preferences_for(settings, software(settings)),
                  load_calibrations(services.db))
    if isinstance(result, Refusal):
        raise result.to_error()
    return dataclasses.replace(result, model=name, model_path=str(resolved.file))
