"""Writing changed settings into the TOML config file, keeping its comments and layout.

The file is the source of truth: a change is written there first, atomically (a temporary file
beside it with the same mode, group and, where the writer may give it, owner, flushed to disk, then
renamed over it), so a crash leaves either the old file or the new one. ``tomlkit`` edits the parsed
document in place, so the admin's comments, order and spacing survive; a key set back to its default
is removed from the file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

import tomlkit
from pydantic import SecretStr
from tomlkit.exceptions import TOMLKitError

from appliance.errors import ConfigError

#: In a change, this value removes the key from the file (the setting goes back to its default).
REMOVE = object()


def toml_value(value: object) -> object:
    """A validated setting value as TOML can hold it: paths and secrets as text, lists and maps as they are."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): toml_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [toml_value(v) for v in value]
    return value


def edited_text(text: str, changes: Mapping[str, object]) -> str:
    """``text`` (a TOML document) with each key of ``changes`` set to its value, or removed for :data:`REMOVE`."""
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"the config file is not valid TOML: {exc}") from None
    for key, value in changes.items():
        if value is REMOVE or value is None:
            document.pop(key, None)
        else:
            document[key] = toml_value(value)
    return tomlkit.dumps(document)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text``: a temporary file beside it (same mode and owner), fsynced, renamed over it."""
    info = path.stat()
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, info.st_mode & 0o7777)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), info.st_mode & 0o7777)
            _same_owner(out.fileno(), info)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _same_owner(fd: int, info: os.stat_result) -> None:
    """Give the new file the old one's owner and group. Only root may give a file away: a service (in the config
    file's group, as a system install's root:appliance file) keeps the group and becomes the owner itself, with no
    chown at all when its own group is already the file's (the hardened unit's system-call filter refuses chown)."""
    now = os.fstat(fd)
    if (now.st_uid, now.st_gid) == (info.st_uid, info.st_gid):
        return
    if os.geteuid() == 0:
        os.fchown(fd, info.st_uid, info.st_gid)
    elif now.st_gid != info.st_gid:
        os.fchown(fd, -1, info.st_gid)


def write_changes(path: Path, changes: Mapping[str, object]) -> None:
    """Write ``changes`` into the config file at ``path``, keeping everything else in it."""
    write_atomically(path, edited_text(path.read_text(encoding="utf-8"), changes))
