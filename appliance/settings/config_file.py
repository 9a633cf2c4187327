"""The TOML config file: which one is read, and reading it as a settings source."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from appliance.errors import ConfigError
from appliance.jsontypes import JsonObject

SYSTEM_CONFIG_PATH = Path("/etc/appliance/appliance.toml")


def config_file_path() -> Path | None:
    """The TOML config file: the one ``APPLIANCE_CONFIG`` names, else the system one if it exists."""
    named = os.environ.get("APPLIANCE_CONFIG")
    if named:
        return Path(named)
    return SYSTEM_CONFIG_PATH if SYSTEM_CONFIG_PATH.exists() else None


def read_config_file(path: Path) -> JsonObject:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


class TomlSource(PydanticBaseSettingsSource):
    """Reads the TOML config file, if one is named or the system one exists."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> JsonObject:
        path = config_file_path()
        return read_config_file(path) if path is not None else {}
