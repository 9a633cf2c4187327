"""The settings page: every setting with its value, where it came from and when a change applies; admins change
them here (through the same runtime settings as ``PATCH /admin/settings``) and can restart the daemon, which drains first."""

from __future__ import annotations

import anyio
from litestar import Request, Response, get, post

from appliance.errors import ApplianceError, BadRequest, NotFound
from appliance.settings import SECRET_SETTINGS, Settings
from appliance.settings.editor import text_value
from appliance.settings.runtime import RuntimeSettings
from appliance.store.store import ModelStore
from appliance.tls.context import served_certificate
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import page, partial
from appliance.webui.settings_view import settings_context


@get("/settings", include_in_schema=False, sync_to_thread=True)
def settings_page(request: Request, runtime_settings: RuntimeSettings, store: ModelStore) -> Response:
    return page(
        request,
        "settings.html",
        active="settings",
        tls=served_certificate(runtime_settings.settings),
        error=None,
        message=None,
        **settings_context(runtime_settings, store),
    )


@post("/settings/restart", guards=[needs("admin")], include_in_schema=False)
async def settings_restart(request: Request, runtime_settings: RuntimeSettings, user: ConsoleUser) -> Response:
    runtime_settings.request_restart(user.actor)
    return partial(request, "_settings_restart.html", supervised=runtime_settings.supervised)


@post("/settings/{name:str}", guards=[needs("admin")], include_in_schema=False)
async def settings_change(
    request: Request, name: str, runtime_settings: RuntimeSettings, store: ModelStore, user: ConsoleUser
) -> Response:
    if name not in Settings.model_fields:
        raise NotFound(f"There is no setting `{name}`.")
    typed = str((await request.form()).get("value") or "")
    error = message = None
    try:
        if name in SECRET_SETTINGS and not typed.strip():
            raise BadRequest(f"{name}: type the new secret (the field never shows the current one).", param=name)
        value = text_value(name, typed)
        changes = await anyio.to_thread.run_sync(runtime_settings.change, user.actor, {name: value})
        message = "Applied now." if changes[0].applies == "live" else "Saved: applies at the next restart."
    except ApplianceError as exc:
        error = exc.message
    context = settings_context(runtime_settings, store)
    row = next(r for r in context["rows"] if r["name"] == name)
    if error is not None:
        row["text"] = typed  # what was typed stays in the field
    return partial(request, "_setting_row.html", r=row, error=error, message=message, **context)


HANDLERS = [settings_page, settings_restart, settings_change]
