"""Reading the admin forms (prices, quotas, cache policies) with the admin API's own checks.

Form fields arrive as text; they are turned into numbers here and then validated
by the same pydantic models the admin API validates its JSON bodies with, so a
value the API refuses is refused here too, with the same field named.
A refused field is a :class:`BadRequest` whose ``param`` names it; the forms
show its message next to that field (:func:`field_errors`). Such an answer is
the form again, with its errors, and so a 200: nothing was changed, and the
browser does not report a failed request for a form the user is still filling.
"""

from __future__ import annotations

from typing import TypeVar

from litestar.datastructures import FormMultiDict
from pydantic import BaseModel, ValidationError

from appliance.errors import BadRequest
from appliance.webui import forms

Model = TypeVar("Model", bound=BaseModel)


def numbers(form: FormMultiDict, fields: tuple[str, ...], labels: dict[str, str] | None = None) -> dict[str, float | int | None]:
    """Each of ``fields`` as a number, or None when left empty."""
    values: dict[str, float | int | None] = {}
    for field in fields:
        raw = forms.optional(form, field, 32)
        if raw is None:
            values[field] = None
            continue
        try:
            value = float(raw)
        except ValueError:
            label = (labels or {}).get(field, field.replace("_", " "))
            raise BadRequest(f"{label} must be a number, or empty.", param=field) from None
        values[field] = int(value) if value.is_integer() and abs(value) < 2**53 else value
    return values


def validated(model: type[Model], values: dict[str, float | int | None]) -> Model:
    """``values`` checked by the admin API's body model; the first problem is a BadRequest naming its field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        message = first["msg"].removeprefix("Value error, ")
        raise BadRequest(f"{field.replace('_', ' ') if field else 'value'}: {message}", param=field) from None


def field_errors(exc: BadRequest, fallback: str) -> dict[str, str]:
    """The message of ``exc`` keyed by the field it names (``fallback`` when it names none)."""
    return {exc.param or fallback: exc.message}
