"""Aliases: names clients may use for an installed variant (``support-bot`` → ``gemma-3-270m:q4_k_m``).

Set and removed through :mod:`appliance.serving.aliases`, the routine
``/admin/aliases`` uses: the target must be an installed, ready model, the
change is audited and the next request sees it. Anyone signed in may read the
list; only admins change it. A refused field is shown next to it.
"""

from __future__ import annotations

from litestar import Request, Response, get, post
from sqlalchemy.engine import Engine

from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest, ModelNotFound
from appliance.serving import aliases
from appliance.serving.names import ModelNames
from appliance.store.store import ModelStore
from appliance.webui import forms
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import TemplateContext, page, partial


def _context(
    names: ModelNames, *, message: str | None = None, errors: dict[str, str] | None = None, entered: dict[str, str] | None = None
) -> TemplateContext:
    listing = names.listing()
    return {
        "aliases": sorted(names.aliases().items()),
        "models": sorted({e["id"] for e in listing if "target" not in e}),
        "message": message,
        "errors": errors or {},
        "entered": entered or {},
    }


@get("/aliases", include_in_schema=False, sync_to_thread=True)
def aliases_page(request: Request, names: ModelNames) -> Response:
    return page(request, "aliases.html", active="aliases", **_context(names))


@post("/aliases/set", guards=[needs("admin")], include_in_schema=False)
async def set_alias(
    request: Request, names: ModelNames, store: ModelStore, db: Engine, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    entered = {f: str(form.get(f) or "") for f in ("name", "target")}
    try:
        name, target = forms.required(form, "name", 64), forms.required(form, "target", 200)
        resolved = aliases.set_alias(names, db, audit, user.actor, name, target, store.catalog.families)
    except (BadRequest, ModelNotFound) as exc:
        param = "target" if isinstance(exc, ModelNotFound) else exc.param or "name"
        message = f"`{entered['target']}` is not an installed model." if isinstance(exc, ModelNotFound) else exc.message
        return partial(request, "_aliases.html", **_context(names, errors={param: message}, entered=entered))
    return partial(request, "_aliases.html", **_context(names, message=f"{name} now names {resolved}."))


@post("/aliases/delete", guards=[needs("admin")], include_in_schema=False)
async def delete_alias(request: Request, names: ModelNames, db: Engine, audit: AuditTrail, user: ConsoleUser) -> Response:
    name = forms.required(await request.form(), "name", 64)
    if name == "default":
        return partial(
            request, "_aliases.html", **_context(names, errors={"name": "`default` follows the default_model setting."})
        )
    removed = aliases.delete_alias(names, db, audit, user.actor, name)
    return partial(
        request,
        "_aliases.html",
        **_context(names, message=f"Alias {name} removed." if removed else f"There was no alias {name}."),
    )


HANDLERS = [aliases_page, set_alias, delete_alias]
