"""Admin API for settings: ``GET /admin/settings`` lists every setting with its value (secrets masked), where
it came from, and whether a change applies live or at restart; ``PATCH /admin/settings`` changes some
(``{"name": value}``, ``null`` for the default); ``POST /admin/settings/restart`` drains and restarts the
daemon. Admin only (``appliance.api.access``)."""

from __future__ import annotations

import anyio
from litestar import Controller, Request, get, patch, post

from appliance.api.access import Access, requires
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.settings.editor import shown
from appliance.settings.runtime import RuntimeSettings, as_json


def settings_answer(runtime: RuntimeSettings) -> JsonObject:
    return {
        "config_file": str(runtime.config_path) if runtime.config_path else None,
        "restart_restarts": runtime.supervised,
        "settings": runtime.rows(),
    }


class SettingsController(Controller):
    path = "/admin/settings"
    opt = requires(Access.ADMIN)

    @get("/")
    async def show(self, runtime_settings: RuntimeSettings) -> JsonObject:
        return settings_answer(runtime_settings)

    @patch("/")
    async def change(self, request: Request, runtime_settings: RuntimeSettings, actor: str) -> JsonObject:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest('Send a JSON object of settings: {"name": value, ...} (null: back to the default).')
        changes = await anyio.to_thread.run_sync(runtime_settings.change, actor, body)
        changed = [
            {"name": c.name, "before": shown(c.name, c.before), "after": shown(c.name, c.after), "applies": c.applies}
            for c in changes
        ]
        return {"changed": as_json(changed), **settings_answer(runtime_settings)}

    @post("/restart", status_code=202)
    async def restart(self, runtime_settings: RuntimeSettings, actor: str) -> JsonObject:
        runtime_settings.request_restart(actor)
        return {"restarting": True, "comes_back": runtime_settings.supervised}
