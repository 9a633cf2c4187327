"""Reading console form fields: trimmed text with a length limit, numbers within bounds."""

from __future__ import annotations

from litestar.datastructures import FormMultiDict

from appliance.errors import BadRequest


def optional(form: FormMultiDict, name: str, limit: int = 2048) -> str | None:
    """The trimmed text of field ``name``, or None when it is empty or missing; BadRequest when over ``limit``."""
    value = form.get(name)
    value = value.strip() if isinstance(value, str) else ""
    if len(value) > limit:
        raise BadRequest(f"{name} is too long.", param=name)
    return value or None


def required(form: FormMultiDict, name: str, limit: int = 2048) -> str:
    """As :func:`optional`, but an empty field is a BadRequest."""
    value = optional(form, name, limit)
    if value is None:
        raise BadRequest(f"{name} is required.", param=name)
    return value


def number(form: FormMultiDict, name: str, kind: type[float] | type[int], low: float, high: float) -> float | None:
    """Field ``name`` as ``kind``, within ``low``..``high``; None when it is empty or missing."""
    raw = form.get(name)
    if raw in (None, ""):
        return None
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be a number.", param=name) from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}.", param=name)
    return value
