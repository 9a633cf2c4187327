"""Admin API of the planner: ``GET /admin/hardware`` and ``GET /admin/plan``.

The admin guard sits in front of ``/admin`` (appliance.api.edge). Settings come
from ``request.app.state.settings``; the store (installed variants) from
``app.state.services.store`` or ``app.state.store`` when present. Model names
only: this API never takes a filesystem path.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from litestar.concurrency import sync_to_thread

from appliance.errors import BadRequest
from appliance.planner.service import hardware_report, live_snapshot, plan_report, preferences_for, resolve_variants, software
from appliance.api.access import Access, requires

MAX_CONTEXT = 1 << 22
MAX_PARALLEL = 4096


def _settings(request: Request) -> Any:
    state = request.app.state
    settings = getattr(state, "settings", None)
    if settings is None and getattr(state, "services", None) is not None:
        settings = state.services.settings
    return settings


def _store(request: Request) -> Any:
    services = getattr(request.app.state, "services", None)
    return getattr(services, "store", None) or getattr(request.app.state, "store", None)


def _calibrations(request: Request) -> tuple[Any, ...]:
    services = getattr(request.app.state, "services", None)
    engine = getattr(services, "db", None)
    if engine is None:
        return ()
    from appliance.planner.calibration import load_calibrations

    return load_calibrations(engine)


class PlanningController(Controller):
    """Hardware report and fit plans."""

    path = "/admin"
    opt = requires(Access.ADMIN)
    tags = ["admin: planner"]

    @get("/hardware")
    async def hardware(self, request: Request) -> dict[str, Any]:
        """This box's hardware and inference software, with every finding and its fix."""
        settings = _settings(request)
        return await sync_to_thread(hardware_report, settings)

    @get("/plan")
    async def plan(self, request: Request, model: str, ctx: int | None = None, parallel: int | None = None) -> dict[str, Any]:
        """Would ``model`` (a family or family:variant, installed or in the catalog) fit, and how."""
        if ctx is not None and not 1 <= ctx <= MAX_CONTEXT:
            raise BadRequest(f"ctx must be between 1 and {MAX_CONTEXT}", param="ctx")
        if parallel is not None and not 1 <= parallel <= MAX_PARALLEL:
            raise BadRequest(f"parallel must be between 1 and {MAX_PARALLEL}", param="parallel")
        if not model or len(model) > 200 or "/" in model or "\\" in model or "\x00" in model:
            raise BadRequest("model must be a model name (family or family:variant)", param="model")
        settings = _settings(request)
        store = _store(request)

        def work() -> dict[str, Any]:
            variants = resolve_variants(model, store=store)
            prefs = preferences_for(settings, software(settings), ctx, parallel)
            return plan_report(live_snapshot(), variants, prefs, _calibrations(request))

        return await sync_to_thread(work)
