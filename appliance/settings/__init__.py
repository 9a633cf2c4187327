"""The one settings object.

Values come, highest priority first, from ``APPLIANCE_*`` environment variables,
then from the TOML file named by ``APPLIANCE_CONFIG`` (system installs use
``/etc/appliance/appliance.toml``), then from the defaults. Every field is
documented where it is declared, in one module per group of settings (``service``,
``engines``, ``usage``, ``network``, ``store``, ``console``); the manual's
configuration reference is generated from the assembled class
(``appliance.manual.config_reference``) and a test keeps the two in step.

Settings are read once, by :func:`load_settings`, and passed to whatever needs
them. Nothing reads them at import time. Each settings object remembers where
every value came from (:meth:`Settings.origin`, traced in ``origins``): the
command line, an environment variable, the config file (``config_file``), or the
default. A running daemon changes settings through ``runtime`` (checked by ``editor``,
written by ``config_writer``, applied at once or at restart as ``applies`` says).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import PrivateAttr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from appliance.errors import ConfigError
from appliance.settings.config_file import SYSTEM_CONFIG_PATH, TomlSource, config_file_path, read_config_file
from appliance.settings.console import ConsoleFields
from appliance.settings.engines import EngineFields, LatencyTargets
from appliance.settings.network import NetworkFields
from appliance.settings.origins import DEFAULT_ORIGIN, SettingOrigin, trace_origins
from appliance.settings.service import ServiceFields
from appliance.settings.store import StoreFields
from appliance.settings.usage import UsageFields

__all__ = [
    "DEFAULT_ORIGIN",
    "SECRET_SETTINGS",
    "SYSTEM_CONFIG_PATH",
    "LatencyTargets",
    "SettingOrigin",
    "Settings",
    "config_file_path",
    "load_settings",
    "read_config_file",
    "trace_origins",
]

#: Settings whose values are secrets: shown as "(set)", never printed.
SECRET_SETTINGS = frozenset({"session_secret", "alert_webhook_secret"})


# The field groups are listed last to first: pydantic orders the fields from the base furthest
# back in the MRO, so the reference and the console list them service, engines, usage, network,
# store, console.
class Settings(ConsoleFields, StoreFields, NetworkFields, UsageFields, EngineFields, ServiceFields, BaseSettings):
    """Runtime configuration of the appliance daemon and CLI."""

    model_config = SettingsConfigDict(env_prefix="APPLIANCE_", extra="forbid", validate_default=True)
    _origins: dict[str, SettingOrigin] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: object) -> None:
        super().__init__(**values)  # type: ignore[arg-type]
        path = config_file_path()
        self._origins = trace_origins(
            list(type(self).model_fields),
            {k: v for k, v in values.items() if not k.startswith("_")},
            os.environ,
            path,
            read_config_file(path) if path is not None else {},
        )

    def origin(self, name: str) -> SettingOrigin:
        """Where the value of setting ``name`` came from."""
        return self._origins.get(name, DEFAULT_ORIGIN)

    def set_origin(self, name: str, origin: SettingOrigin) -> None:
        """Record where setting ``name`` comes from now, after a change at runtime wrote it to the config file."""
        self._origins[name] = origin

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlSource(settings_cls))

    # Paths derived from data_dir: one place names them all.
    @property
    def db_path(self) -> Path:
        return self.data_dir / "appliance.db"

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def admin_socket(self) -> Path:
        return self.run_dir / "admin.sock"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "applianced.lock"


def load_settings(**overrides: object) -> Settings:
    """Read settings once; turn validation errors into one readable ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            env = f"APPLIANCE_{field.upper()}"
            problems.append(f"{field} ({env}): {err['msg']}; got {err.get('input')!r}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
