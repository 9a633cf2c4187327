"""The settings page: each setting's row (value with secrets masked, where it came from, when a change applies),
with what its form field shows and offers."""

from __future__ import annotations

import json
import typing

from pydantic import SecretStr

from appliance.jsontypes import JsonObject
from appliance.settings import SECRET_SETTINGS, Settings
from appliance.settings.runtime import RuntimeSettings
from appliance.store.store import ModelStore


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
