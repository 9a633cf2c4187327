"""Checking a change of settings against the settings model, before anything is written or applied.

:func:`plan_change` takes the running settings and a JSON object of ``{name: value}`` (``null``: back
to the default) and answers a :class:`ChangePlan`: each setting's validated new value, what the file
gets, and whether it applies now or at the next start. The whole settings object is validated with
the change in place, so rules between settings (a webhook URL needs its secret) hold as they do at
start. A setting given by an environment variable or on the command line is refused: those win over
the file, so writing the file would change nothing.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr, ValidationError

from appliance.errors import BadRequest, Conflict
from appliance.settings import SECRET_SETTINGS, Settings
from appliance.settings.applies import Applies, applies
from appliance.settings.config_writer import REMOVE

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


def text_value(name: str, text: str) -> object:
    """The value an admin typed (in the console or on the command line) for setting ``name``: text as it
    is for text settings, JSON for the others (``true``, ``8080``, ``["a", "b"]``); an empty text means "back to
    the default" (``None``)."""
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


@dataclass(frozen=True, slots=True)
class SettingChange:
    """One setting's change: the value before and after (validated), and when it takes effect."""

    name: str
    before: object
    after: object
    applies: Applies
    file_value: object  # what the config file gets: the value, or REMOVE for "back to the default"


@dataclass(frozen=True, slots=True)
class ChangePlan:
    changes: list[SettingChange] = field(default_factory=list)

    def file_changes(self) -> dict[str, object]:
        return {c.name: c.file_value for c in self.changes}


def shown(name: str, value: object) -> object:
    """A value as answers, pages and the audit log show it: secrets as "(set)"/"(not set)", URLs without credentials."""
    if name == "session_secret" and not value:
        return "(generated, in the data dir)"
    if name in SECRET_SETTINGS or isinstance(value, SecretStr):
        return "(set)" if value else "(not set)"
    if isinstance(value, str) and "://" in value and "@" in value:
        parts = urlsplit(value)
        if parts.username or parts.password:
            netloc = f"(redacted)@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return value


def _default(name: str) -> object:
    return Settings.model_fields[name].get_default(call_default_factory=True)


def _refusal(error: ValidationError, names: list[str]) -> BadRequest:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    param = where.split(".")[0] if where else next((n for n in names if n in first["msg"]), names[0])
    message = first["msg"].removeprefix("Value error, ")
    return BadRequest(f"{where or param}: {message}", param=param)


#: Settings changed in the config file on the box only, never through the daemon: one names a program the daemon
#: runs, the other where all its state lives. A console admin who could set them could run any program as the service.
FILE_ONLY: dict[str, str] = {
    "vllm_python": "it names a program the daemon runs",
    "data_dir": "it moves all of the daemon's state",
}


def plan_change(settings: Settings, requested: Mapping[str, object]) -> ChangePlan:
    """Validate ``requested`` against the whole settings model; raise BadRequest naming the field, or Conflict
    for a setting that the environment or the command line sets."""
    if not requested:
        raise BadRequest("Name at least one setting to change.")
    fields = Settings.model_fields
    for name in requested:
        if name not in fields:
            raise BadRequest(f"There is no setting `{name}`.", param=name)
        if name in FILE_ONLY:
            raise BadRequest(f"`{name}` is changed in the config file on the box only: {FILE_ONLY[name]}.", param=name)
        origin = settings.origin(name)
        if origin.source in ("environment", "command line"):
            raise Conflict(
                f"`{name}` is set by {origin} ({origin.source}), which wins over the config file: change it there.",
                param=name,
            )
    values = {name: getattr(settings, name) for name in fields}
    values.update({name: _default(name) if value is None else value for name, value in requested.items()})
    try:
        candidate = Settings.__pydantic_validator__.validate_python(values)
    except ValidationError as exc:
        raise _refusal(exc, list(requested)) from None
    changes = []
    for name, value in requested.items():
        after = getattr(candidate, name)
        changes.append(SettingChange(name, getattr(settings, name), after, applies(name), REMOVE if value is None else after))
    return ChangePlan(changes)
