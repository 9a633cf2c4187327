"""Fit badges: would this variant run on this box? The planner answers, with its reasons.

Installed variants are planned exactly as a load would plan them
(``services.make_plan``). Catalog variants are planned from their published
facts and size with the same planner and this box's hardware. Anything the
planner cannot answer (no planner yet, no facts) is shown as "unknown", never
as an error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from appliance.errors import ApplianceError, DoesNotFit

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


def _describe(plan: Any) -> Fit:
    reason = str(getattr(plan, "reason", "") or "")
    rejected = getattr(plan, "rejected", ()) or ()
    lines = [reason] + [f"Not chosen — {what}: {why}" for what, why in rejected]
    memory = getattr(plan, "memory", ()) or ()
    for row in memory:
        lines.append(f"{row.device}: weights {row.weights / 2**30:.2f} GiB + KV {row.kv_cache / 2**30:.2f} GiB"
                     f" + compute {row.compute / 2**30:.2f} GiB + overhead {row.overhead / 2**30:.2f} GiB;"
                     f" {row.headroom / 2**30:.2f} GiB left of {row.free / 2**30:.2f} GiB free")
    tight = any(getattr(row, "headroom", TIGHT_HEADROOM) < TIGHT_HEADROOM for row in memory)
    backend = getattr(plan, "backend", "?")
    devices = ",".join(getattr(plan, "devices", ()) or ()) or "?"
    summary = f"{backend} on {devices}, {getattr(plan, 'context', '?')} ctx"
    return Fit("tight" if tight else "fits", summary, "\n".join(line for line in lines if line))


def _refusal(exc: Exception) -> Fit:
    message = exc.message if isinstance(exc, ApplianceError) else str(exc)
    return Fit("no", "does not fit", message or "The planner found no placement on this box.")


class FitCache:
    """Planning is pure but not free: remember answers for a short while."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, Fit]] = {}

    def get(self, key: str, compute: Any) -> Fit:
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


def installed_fit(services: Any, name: str) -> Fit:
    make_plan = getattr(services, "make_plan", None)
    if make_plan is None:
        return UNKNOWN

    def compute() -> Fit:
        try:
            return _describe(make_plan(name))
        except ImportError:
            return UNKNOWN

    return _CACHE.get("installed:" + name, compute)


def _row_fit(row: Any) -> Fit:
    memory = row.memory or ()
    lines = [row.reason] + [
        f"{m.device}: weights {m.weights / 2**30:.2f} GiB + KV {m.kv_cache / 2**30:.2f} GiB + compute {m.compute / 2**30:.2f} GiB"
        f" + overhead {m.overhead / 2**30:.2f} GiB; {m.headroom / 2**30:.2f} GiB left of {m.free / 2**30:.2f} GiB free"
        for m in memory]
    if not row.fits:
        return Fit("no", "does not fit", "\n".join(lines))
    tight = any(m.headroom < TIGHT_HEADROOM for m in memory)
    return Fit("tight" if tight else "fits", f"{row.backend} · {row.placement}", "\n".join(lines))


def catalog_fits(services: Any, catalog: Any) -> dict[str, dict[str, Fit]]:
    """Fit of every catalog variant on this box: family -> variant -> Fit (the planner's ``plan_all``)."""
    now = time.monotonic()
    hit = _TABLE_CACHE.get("table")
    if hit is not None and now - hit[0] < CACHE_S:
        return hit[1]
    table: dict[str, dict[str, Fit]] = {}
    try:
        from appliance.planner.plan import plan_all
        from appliance.planner.service import live_snapshot, preferences_for, software, variants_from_catalog

        snapshot = live_snapshot()
        prefs = preferences_for(services.settings, software(services.settings))
        for name in catalog.families:
            variants = variants_from_catalog(name, catalog)
            if variants:
                table[name] = {row.variant: _row_fit(row) for row in plan_all(snapshot, variants, prefs)}
    except Exception:  # no planner, or it failed: the badges say "unknown"
        log.debug("planning the catalog failed", exc_info=True)
    _TABLE_CACHE["table"] = (now, table)
    return table


_TABLE_CACHE: dict[str, tuple[float, dict[str, dict[str, Fit]]]] = {}
