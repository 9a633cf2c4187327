"""From a resolved variant to a Plan for this box: store facts + live hardware + settings → the pure planner."""

from __future__ import annotations

import dataclasses

from sqlalchemy.engine import Engine

from appliance.errors import DoesNotFit
from appliance.planner.calibration import load_calibrations
from appliance.planner.plan import plan
from appliance.planner.service import live_snapshot, preferences_for, software
from appliance.planner.types import Plan, Refusal, Variant
from appliance.settings import Settings
from appliance.store.store import ResolvedVariant


def variant_for_planner(resolved: ResolvedVariant) -> Variant:
    facts = resolved.model_facts
    if facts is None:
        raise DoesNotFit(f"{resolved.name} has no architecture facts; re-import it so it can be inspected.")
    return Variant(
        family=resolved.family,
        name=resolved.variant,
        format=resolved.format,
        quantization=resolved.quantization,
        size_bytes=resolved.size_bytes,
        facts=facts,
        path=str(resolved.file),
    )


class LoadPlanner:
    """Plans the load of exactly one installed variant; raises DoesNotFit with the reason."""

    def __init__(self, settings: Settings, db: Engine):
        self._settings = settings
        self._db = db

    def plan(self, resolved: ResolvedVariant) -> Plan:
        result = plan(
            live_snapshot(),
            [variant_for_planner(resolved)],
            preferences_for(self._settings, software(self._settings)),
            load_calibrations(self._db),
        )
        if isinstance(result, Refusal):
            raise result.to_error()
        return dataclasses.replace(result, model=resolved.name, model_path=str(resolved.file))
