"""Fit badges: would this variant run on this box? The planner answers, with its reasons.

Installed variants are planned exactly as a load would plan them
(:class:`~appliance.serving.load_plan.LoadPlanner`); variants available on the
hub but not downloaded, from the architecture of a ready variant of their family
and their listed size. Catalog variants are
planned from their published facts and size with the same planner and this
box's hardware. Anything the planner cannot answer (no facts, a planner
failure) is shown as "unknown", never as an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from appliance.catalog import Catalog
from appliance.errors import ApplianceError, DoesNotFit
from appliance.planner.plan import plan_all
from appliance.planner.service import available_fits as plan_available
from appliance.planner.service import live_snapshot, preferences_for, software, variants_from_catalog
from appliance.planner.types import DeviceMemory, Plan, PlanRow
from appliance.serving.load_plan import LoadPlanner
from appliance.serving.names import ModelNames
from appliance.settings import Settings
from appliance.store.store import ModelStore
from appliance.store.variants import VariantInfo

log = logging.getLogger("appliance.webui")

CACHE_S = 30.0


@dataclass(frozen=True)
class Fit:
    status: str  # fits | tight | no | unknown
    summary: str
    explanation: str

    @property
    def label(self) -> str:
        return {"fits": "fits", "tight": "tight fit", "no": "does not fit"}.get(self.status, "fit unknown")


UNKNOWN = Fit("unknown", "unknown", "The planner could not assess this variant.")
TIGHT_HEADROOM = 512 * 2**20


def _memory_line(m: DeviceMemory) -> str:
    return (
        f"{m.device}: weights {m.weights / 2**30:.2f} GiB + KV {m.kv_cache / 2**30:.2f} GiB"
        f" + compute {m.compute / 2**30:.2f} GiB + overhead {m.overhead / 2**30:.2f} GiB;"
        f" {m.headroom / 2**30:.2f} GiB left of {m.free / 2**30:.2f} GiB free"
    )


def _tight(memory: tuple[DeviceMemory, ...]) -> bool:
    return any(m.headroom < TIGHT_HEADROOM for m in memory)


def _describe(plan: Plan) -> Fit:
    lines = [plan.reason, *(f"Not chosen — {what}: {why}" for what, why in plan.rejected), *map(_memory_line, plan.memory)]
    summary = f"{plan.backend} on {','.join(plan.devices) or '?'}, {plan.context} ctx"
    return Fit("tight" if _tight(plan.memory) else "fits", summary, "\n".join(line for line in lines if line))


def _refusal(exc: Exception) -> Fit:
    message = exc.message if isinstance(exc, ApplianceError) else str(exc)
    return Fit("no", "does not fit", message or "The planner found no placement on this box.")


class FitCache:
    """Planning is pure but not free: remember answers for a short while."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, Fit]] = {}

    def get(self, key: str, compute: Callable[[], Fit]) -> Fit:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        try:
            fit = compute()
        except ApplianceError as exc:
            fit = _refusal(exc) if isinstance(exc, DoesNotFit) else Fit("unknown", "unknown", exc.message)
        except Exception:  # a planner bug must not break the models page
            log.debug("planning %s failed", key, exc_info=True)
            fit = UNKNOWN
        self._cache[key] = (now, fit)
        return fit


_CACHE = FitCache()


def installed_fit(load_planner: LoadPlanner, names: ModelNames, name: str) -> Fit:
    """The fit of the installed variant ``name``, planned as loading it would be."""
    return _CACHE.get("installed:" + name, lambda: _describe(load_planner.plan(names.resolve(name))))


def _row_fit(row: PlanRow) -> Fit:
    lines = [row.reason] + [_memory_line(m) for m in row.memory]
    if not row.fits:
        return Fit("no", "does not fit", "\n".join(lines))
    return Fit("tight" if _tight(row.memory) else "fits", f"{row.backend} · {row.placement}", "\n".join(lines))


def available_fits(store: ModelStore, infos: list[VariantInfo]) -> dict[str, Fit]:
    """``family:variant`` → the fit of each variant available on the hub (absent: the planner cannot tell)."""
    return {name: _row_fit(row) for name, row in plan_available(store.settings, store.db, infos).items()}


def catalog_fits(settings: Settings, catalog: Catalog) -> dict[str, dict[str, Fit]]:
    """Fit of every catalog variant on this box: family -> variant -> Fit (the planner's ``plan_all``)."""
    now = time.monotonic()
    hit = _TABLE_CACHE.get("table")
    if hit is not None and now - hit[0] < CACHE_S:
        return hit[1]
    table: dict[str, dict[str, Fit]] = {}
    try:
        snapshot = live_snapshot()
        prefs = preferences_for(settings, software(settings))
        for name in catalog.families:
            variants = variants_from_catalog(name, catalog)
            if variants:
                table[name] = {row.variant: _row_fit(row) for row in plan_all(snapshot, variants, prefs)}
    except Exception:  # the planner failed: the badges say "unknown"
        log.debug("planning the catalog failed", exc_info=True)
    _TABLE_CACHE["table"] = (now, table)
    return table


_TABLE_CACHE: dict[str, tuple[float, dict[str, dict[str, Fit]]]] = {}
