"""Settings changed while the daemon runs, from the console, ``PATCH /admin/settings`` or ``appliancectl``.

:class:`RuntimeSettings` is the one place a change goes through: it is checked against the settings
model (:mod:`appliance.settings.editor`), written into the config file (which stays the source of
truth; :mod:`appliance.settings.config_writer`), applied to the running settings object where the
setting is live (:mod:`appliance.settings.applies`), and recorded in the audit log with its value
before and after (secrets masked). A setting that applies at restart is remembered as pending until
then. An admin may ask for a restart: the daemon drains as on SIGTERM and exits with
:data:`RESTART_EXIT_CODE`, which systemd (``Restart=on-failure``) answers by starting it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from appliance.errors import ApplianceError, Conflict
from appliance.jsontypes import JsonObject
from appliance.settings import Settings
from appliance.settings.applies import applies
from appliance.settings.config_writer import REMOVE, write_changes
from appliance.settings.editor import SettingChange, plan_change, shown
from appliance.settings.origins import DEFAULT_ORIGIN, SettingOrigin

log = logging.getLogger("appliance.settings")

#: The daemon's exit status after a restart asked for from the console or the API (EX_TEMPFAIL):
#: not 0, so systemd's ``Restart=on-failure`` starts the service again.
RESTART_EXIT_CODE = 75


class AuditRecorder(Protocol):
    def record(self, actor: str, action: str, target: str | None = None, detail: str | None = None) -> None: ...


class ConfigFileUnwritable(ApplianceError):
    """The config file could not be written (permissions, a read-only file system)."""

    status = 500
    code = "config_file_unwritable"


def under_systemd() -> bool:
    """Whether the daemon runs as a systemd service, which starts it again after a restart exit."""
    return bool(os.environ.get("NOTIFY_SOCKET") or os.environ.get("INVOCATION_ID"))


class RuntimeSettings:
    """Changes settings of the running daemon: validated, written to the file, applied live where possible, audited."""

    def __init__(
        self,
        settings: Settings,
        audit: AuditRecorder,
        config_path: Path | None,
        *,
        after_live_change: Callable[[set[str]], None] = lambda names: None,
        supervised: bool = False,
    ):
        self.settings = settings
        self.config_path = config_path
        self.supervised = supervised
        self._audit = audit
        self._after_live_change = after_live_change
        self._lock = threading.Lock()
        self._pending: dict[str, object] = {}
        self.restart_requested = asyncio.Event()

    def pending(self) -> dict[str, object]:
        """Settings written to the file that take effect at the next start, with their new values."""
        return dict(self._pending)

    def change(self, actor: str, requested: Mapping[str, object]) -> list[SettingChange]:
        """Change the settings in ``requested`` (``None``: back to the default), or change nothing and raise."""
        with self._lock:
            plan = plan_change(self.settings, requested)
            if self.config_path is None:
                raise Conflict(
                    "This daemon reads no config file, so a change would not outlive it: start it with APPLIANCE_CONFIG "
                    "naming a TOML file (an empty one will do), or use /etc/appliance/appliance.toml."
                )
            try:
                write_changes(self.config_path, plan.file_changes())
            except OSError as exc:
                raise ConfigFileUnwritable(f"The config file {self.config_path} could not be written: {exc.strerror}.") from None
            live = set()
            for change in plan.changes:
                in_file = change.file_value is not REMOVE
                origin = SettingOrigin("config file", str(self.config_path)) if in_file else DEFAULT_ORIGIN
                if change.applies == "live":
                    setattr(self.settings, change.name, change.after)
                    self.settings.set_origin(change.name, origin)
                    live.add(change.name)
                elif change.after == change.before:
                    self._pending.pop(change.name, None)
                else:
                    self._pending[change.name] = change.after
                before, after = shown(change.name, change.before), shown(change.name, change.after)
                self._audit.record(actor, "settings.change", change.name, f"{before!r} -> {after!r} ({change.applies})")
        if live:
            self._after_live_change(live)
        for change in plan.changes:  # after a live log level took effect; names only, never values
            log.info("setting %s changed by %s (%s)", change.name, actor, change.applies)
        return plan.changes

    def request_restart(self, actor: str) -> None:
        """Ask the daemon to drain and exit for a restart (systemd starts it again; run by hand, it stays stopped)."""
        self._audit.record(actor, "daemon.restart", None, "supervised" if self.supervised else "not supervised: stops")
        self.restart_requested.set()

    def rows(self) -> list[JsonObject]:
        """Every setting: its value (secrets masked), where it came from, when a change applies, and any pending value."""
        out: list[JsonObject] = []
        for name, field in Settings.model_fields.items():
            origin = self.settings.origin(name)
            row: JsonObject = {
                "name": name,
                "env": f"APPLIANCE_{name.upper()}",
                "value": as_json(shown(name, getattr(self.settings, name))),
                "source": origin.source,
                "where": origin.where,
                "applies": applies(name),
                "editable": origin.source not in ("environment", "command line"),
                "pending_restart": name in self._pending,
                "description": field.description or "",
            }
            if name in self._pending:
                row["pending_value"] = as_json(shown(name, self._pending[name]))
            out.append(row)
        return out


def as_json(value: object) -> object:
    """A shown value in JSON terms: paths as text, lists and maps element by element."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value
