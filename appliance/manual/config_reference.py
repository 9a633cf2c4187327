"""The configuration reference, generated from the settings model.

Every field of :class:`appliance.settings.Settings` becomes one row: its name, its environment
variable, its type, its default and its description. ``appliancectl config reference`` prints the
table; ``python -m appliance.manual.config_reference`` writes the manual's page
(``docs/configuration-reference.md``), and ``--check`` exits 1 when the committed page differs,
which a test also asserts, so a setting added without documentation fails the build.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import types
import typing
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from appliance.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration-reference.md"

INTRO = """# Configuration reference

Every setting of the appliance, generated from the settings model (`appliance/settings/`) by
`python -m appliance.manual.config_reference`; a test fails when this page and the model differ.
Each setting is read from its `APPLIANCE_*` environment variable first, then from the TOML file named by
`APPLIANCE_CONFIG` (system installs: `/etc/appliance/appliance.toml`, where the key is the setting's
name), then the default. List and map values are JSON in environment variables. How to set them:
[Configuration](configuration.md).
"""

_SCALARS: dict[object, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "text",
    Path: "path",
    SecretStr: "secret text",
}


def type_name(annotation: object) -> str:
    """A reader's name for a setting's type: ``integer``, ``one of `a`, `b```, ``list of text``, ``path or unset``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        name = " or ".join(type_name(arg) for arg in present)
        return f"{name} or unset" if len(present) < len(args) else name
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in annotation)
    scalar = _SCALARS.get(annotation)
    if scalar is None:
        raise TypeError(f"no reference name for the setting type {annotation!r}: add it to _SCALARS")
    return scalar


def bounds(field: FieldInfo) -> str:
    """The field's numeric limits as ``≥ 1``, ``≤ 65535``, ``> 0``, joined by commas."""
    parts = []
    for item in field.metadata:
        if isinstance(item, Ge):
            parts.append(f"≥ {item.ge}")
        elif isinstance(item, Gt):
            parts.append(f"> {item.gt}")
        elif isinstance(item, Le):
            parts.append(f"≤ {item.le}")
        elif isinstance(item, Lt):
            parts.append(f"< {item.lt}")
    return ", ".join(parts)


def default_text(name: str, field: FieldInfo) -> str:
    """The default as the reader would write it; the data dir's depends on the working directory."""
    if field.default_factory is not None:
        if name == "data_dir":
            return "`./appliance-data`"
        value = field.get_default(call_default_factory=True)
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool | list | dict):
        return f"`{json.dumps(value)}`"  # as written in an environment variable
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """The reference table, one row per setting, in the settings model's order."""
    lines = [
        "| Setting | Environment variable | Type | Default | Meaning |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        kind = type_name(field.annotation)
        limits = bounds(field)
        if limits:
            kind = f"{kind} ({limits})"
        description = field.description or ""
        cells = [f"`{name}`", f"`APPLIANCE_{name.upper()}`", _cell(kind), _cell(default_text(name, field)), _cell(description)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reference_page() -> str:
    """The whole page: the introduction, then the table."""
    return f"{INTRO}\n{reference_markdown()}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the manual's configuration reference page.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the settings model")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page to write (default: {PAGE})")
    args = parser.parse_args(argv)
    page = reference_page()
    if args.check:
        current = args.page.read_text(encoding="utf-8") if args.page.exists() else ""
        if current != page:
            print(f"{args.page} differs from the settings model: run python -m {__spec__.name}", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
