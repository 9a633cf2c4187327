"""Prices: per model family, per variant, or `*` for everything, in the configured currency per million tokens.

Reads and changes go through the quota service (``QuotaService.list_prices``,
``set_price``, ``delete_price``), as ``/admin/prices`` does, with the admin API's
own body model checking the numbers; the service audits every change and the
meter uses a new price from the next request. Anyone signed in may read the
prices; only admins change them. A refused field is shown next to it.
"""

from __future__ import annotations

from litestar import Request, Response, get, post

from appliance.api.usage import PriceUpdate
from appliance.errors import BadRequest, NotFound
from appliance.metering.admin import PRICE_FIELDS, QuotaService
from appliance.serving.names import ModelNames
from appliance.settings import Settings
from appliance.webui import forms
from appliance.webui.admin_forms import field_errors, numbers, validated
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import TemplateContext, page, partial

LABELS = {"input_per_m": "Input", "output_per_m": "Output", "cached_per_m": "Cached input"}


def _choices(names: ModelNames) -> list[str]:
    """What a price may name: `*`, each installed family and each installed variant."""
    variants = sorted({e["id"] for e in names.listing() if "target" not in e})
    families = sorted({v.split(":", 1)[0] for v in variants})
    return ["*", *families, *variants]


def _context(
    quotas: QuotaService,
    names: ModelNames,
    settings: Settings,
    *,
    message: str | None = None,
    errors: dict[str, str] | None = None,
    entered: dict[str, str] | None = None,
) -> TemplateContext:
    return {
        "prices": quotas.list_prices(),
        "choices": _choices(names),
        "currency": settings.currency,
        "fields": [(f, LABELS[f]) for f in PRICE_FIELDS],
        "message": message,
        "errors": errors or {},
        "entered": entered or {},
    }


@get("/prices", include_in_schema=False, sync_to_thread=True)
def prices_page(request: Request, quotas: QuotaService, names: ModelNames, settings: Settings) -> Response:
    return page(request, "prices.html", active="prices", **_context(quotas, names, settings))


@post("/prices/set", guards=[needs("admin")], include_in_schema=False)
async def set_price(request: Request, quotas: QuotaService, names: ModelNames, settings: Settings, user: ConsoleUser) -> Response:
    form = await request.form()
    entered = {f: str(form.get(f) or "") for f in ("model", *PRICE_FIELDS)}
    try:
        model = forms.required(form, "model", 200)
        body = validated(PriceUpdate, {k: v for k, v in numbers(form, PRICE_FIELDS, LABELS).items() if v is not None})
        changes = {k: v for k, v in body.model_dump(include=body.model_fields_set).items() if v is not None}
        if not changes:
            raise BadRequest("Give at least one rate.", param="input_per_m")
        row = quotas.set_price(model, changes, user.actor)
    except BadRequest as exc:
        return partial(
            request, "_prices.html", **_context(quotas, names, settings, errors=field_errors(exc, "model"), entered=entered)
        )
    message = (
        f"Price of {row['model']} saved: {row['input_per_m']:g} in, {row['output_per_m']:g} out, "
        f"{row['cached_per_m']:g} cached, {settings.currency} per 1M tokens."
    )
    return partial(request, "_prices.html", **_context(quotas, names, settings, message=message))


@post("/prices/clear", guards=[needs("admin")], include_in_schema=False)
async def clear_price(
    request: Request, quotas: QuotaService, names: ModelNames, settings: Settings, user: ConsoleUser
) -> Response:
    model = forms.required(await request.form(), "model", 200)
    try:
        quotas.delete_price(model, user.actor)
    except (BadRequest, NotFound) as exc:
        return partial(request, "_prices.html", **_context(quotas, names, settings, errors={"model": exc.message}))
    return partial(request, "_prices.html", **_context(quotas, names, settings, message=f"Price of {model} cleared."))


HANDLERS = [prices_page, set_price, clear_price]
