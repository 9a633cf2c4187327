"""Where each setting's value came from: the command line, an environment variable, the config file, or the default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True, slots=True)
class SettingOrigin:
    """Where one setting's value came from: ``where`` names the file, variable or option."""

    source: Literal["default", "config file", "environment", "command line"]
    where: str | None = None

    def __str__(self) -> str:
        return f"{self.source} {self.where}" if self.where else self.source


DEFAULT_ORIGIN = SettingOrigin("default")


def trace_origins(
    names: list[str],
    given: Mapping[str, object],
    environ: Mapping[str, str],
    config_path: Path | None,
    config: Mapping[str, object],
) -> dict[str, SettingOrigin]:
    """Where each setting in ``names`` comes from, by the sources' priority: values given to the
    constructor (the command line's options), then ``APPLIANCE_*`` variables (matched without
    regard to case, as the settings loader reads them), then the config file, else the default."""
    env_names = {key.lower(): key for key in environ}
    origins: dict[str, SettingOrigin] = {}
    for name in names:
        variable = env_names.get(f"appliance_{name}")
        if name in given:
            origins[name] = SettingOrigin("command line", "--" + name.replace("_", "-"))
        elif variable is not None:
            origins[name] = SettingOrigin("environment", variable)
        elif name in config:
            origins[name] = SettingOrigin("config file", str(config_path))
        else:
            origins[name] = DEFAULT_ORIGIN
    return origins
