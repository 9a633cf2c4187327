"""Admin API of the planner: ``GET /admin/hardware`` and ``GET /admin/plan``.

Admin only (``appliance.api.access``). Model names only: this API never takes a
filesystem path.
"""

from __future__ import annotations

from litestar import Controller, get
from litestar.concurrency import sync_to_thread
from sqlalchemy.engine import Engine

from appliance.api.access import Access, requires
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.planner.calibration import load_calibrations
from appliance.planner.service import hardware_report, live_snapshot, plan_report, preferences_for, resolve_variants, software
from appliance.settings import Settings
from appliance.store.store import ModelStore

MAX_CONTEXT = 1 << 22
MAX_PARALLEL = 4096


class PlanningController(Controller):
    """Hardware report and fit plans."""

    path = "/admin"
    opt = requires(Access.ADMIN)
    tags = ["admin: planner"]

    @get("/hardware")
    async def hardware(self, settings: Settings) -> JsonObject:
        """This box's hardware and inference software, with every finding and its fix."""
        return await sync_to_thread(hardware_report, settings)

    @get("/plan")
    async def plan(
        self, model: str, settings: Settings, store: ModelStore, db: Engine, ctx: int | None = None, parallel: int | None = None
    ) -> JsonObject:
        """Would ``model`` (a family or family:variant, installed or in the catalog) fit, and how."""
        if ctx is not None and not 1 <= ctx <= MAX_CONTEXT:
            raise BadRequest(f"ctx must be between 1 and {MAX_CONTEXT}", param="ctx")
        if parallel is not None and not 1 <= parallel <= MAX_PARALLEL:
            raise BadRequest(f"parallel must be between 1 and {MAX_PARALLEL}", param="parallel")
        if not model or len(model) > 200 or "/" in model or "\\" in model or "\x00" in model:
            raise BadRequest("model must be a model name (family or family:variant)", param="model")

        def work() -> JsonObject:
            variants = resolve_variants(model, store=store)
            prefs = preferences_for(settings, software(settings), ctx, parallel)
            return plan_report(live_snapshot(), variants, prefs, load_calibrations(db))

        return await sync_to_thread(work)
