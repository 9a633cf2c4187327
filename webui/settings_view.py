"""The settings page: each setting's row (value with secrets masked, where it came from, when a change applies),
and the typed value of a setting read back from its form field."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

from pydantic import SecretStr

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.settings import SECRET_SETTINGS, Settings
from appliance.settings.runtime import RuntimeSettings
from appliance.store.store import ModelStore

_TEXT = (str, Path, SecretStr)


def _is_text(annotation: object) -> bool:
    """Whether a field's type is written as plain text (text, a path, a secret, one of some words)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in args)
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        return len(present) == 1 and _is_text(present[0])
    return annotation in _TEXT


def form_value(name: str, text: str) -> object:
    """The value an admin typed for setting ``name``: text as it is for text settings, JSON for the others
    (``true``, ``8080``, ``["a", "b"]``); an empty field means "back to the default" (``None``)."""
    field = Settings.model_fields.get(name)
    if field is None:
        raise BadRequest(f"There is no setting `{name}`.", param=name)
    text = text.strip()
    if not text:
        return None
    if _is_text(field.annotation):
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise BadRequest(f'{name}: write a JSON value (true, 8080, ["a", "b"], {{"k": "v"}}).', param=name) from None


def typed_text(row: JsonObject) -> str:
    """The value as it goes back into its form field: text as it is, other values as JSON."""
    value = row["value"]
    if row["name"] in SECRET_SETTINGS or isinstance(value, str):
        return "" if row["name"] in SECRET_SETTINGS else str(value)
    return "" if value is None else json.dumps(value)


def choices(name: str, store: ModelStore) -> list[str] | None:
    """The values a setting's field offers as a list: the installed models for default_model, the words of a
    one-of setting, true/false for a switch; None for free text."""
    if name == "default_model":
        return sorted(v.name for v in store.list() if v.status == "ready")
    annotation = Settings.model_fields[name].annotation
    if annotation is bool:
        return ["true", "false"]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return None


def settings_context(runtime: RuntimeSettings, store: ModelStore) -> JsonObject:
    rows = runtime.rows()
    for row in rows:
        row["text"] = typed_text(row)
        row["choices"] = choices(str(row["name"]), store)
        row["secret"] = row["name"] in SECRET_SETTINGS or Settings.model_fields[str(row["name"])].annotation in (
            SecretStr,
            SecretStr | None,
        )
    return {
        "rows": rows,
        "config_file": runtime.config_path,
        "supervised": runtime.supervised,
        "pending": sorted(runtime.pending()),
    }
