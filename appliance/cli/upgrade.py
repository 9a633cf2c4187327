"""`appliancectl upgrade`: in place from the sources, or from a bundle with an automatic rollback.

``upgrade --bundle FILE`` (system mode, a box installed from a bundle): the bundle is verified and its release
built beside the running one (:mod:`appliance.release.releases`); the service is stopped, the database
backed up, ``current`` switched and the service started. The daemon migrates the database as it starts, so
the new version's migrations run only in a daemon that then has to pass the health check: ``/readyz`` over
the box's HTTPS within ``--timeout``, with no restart of the unit meanwhile. Unhealthy, the service is
stopped, ``current`` switched back, the backup restored when the schema changed, and the old release
started again; the command then fails. The replaced release stays for ``upgrade --rollback``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import click

from appliance.cli.setup import SYSTEM_PREFIX, UNIT_NAME, UNIT_PATH, listener_url, systemd_is_init, unit_source, wait_ready
from appliance.db import engine as dbmod
from appliance.db.backup import backup, backups_dir
from appliance.release.manifest import BundleRefused, Log
from appliance.release.releases import Layout, build_venv, install_debs, is_newer, prune, switch, unpack_verified
from appliance.settings import Settings
from appliance.tls.context import cert_source

RECORD = "upgrade.json"


class Unhealthy(Exception):
    """The started release did not pass the health check; the message says what was seen."""


def _systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=check)


def _unit(*props: str) -> dict[str, str]:
    out = _systemctl("show", UNIT_NAME, "-p", ",".join(props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def db_revision(db_path: Path) -> str | None:
    """The schema revision alembic recorded in the database, or None when it has none."""
    if not db_path.is_file():
        return None
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error:
            return None
    return str(row[0]) if row else None


def _owner_of(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, info.st_gid


def back_up(settings: Settings, name: str) -> Path:
    """A consistent copy of the (stopped) service's database in the backups folder, owned as the data dir is."""
    folder = backups_dir(settings.data_dir)
    path = Path(str(backup(settings.db_path, folder, name)["path"]))
    uid, gid = _owner_of(Path(settings.data_dir))
    os.chown(folder, uid, gid)
    os.chown(path, uid, gid)
    return path


def restore_copy(settings: Settings, saved: Path) -> None:
    """Put ``saved`` back as the database, byte for byte, while the service is stopped."""
    db = Path(settings.db_path)
    uid, gid = _owner_of(db)
    partial = db.with_name(db.name + ".restoring")
    shutil.copyfile(saved, partial)
    os.chown(partial, uid, gid)
    os.chmod(partial, 0o600)
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    os.replace(partial, db)


def _install_unit(release: Path) -> None:
    package = next((release / "venv" / "lib").glob("python3*/site-packages/appliance"))
    shutil.copyfile(unit_source(package, SYSTEM_PREFIX), UNIT_PATH)
    _systemctl("daemon-reload")


def start_and_check(settings: Settings, release: Path, timeout: float) -> None:
    """Start the service on ``release``'s unit; :class:`Unhealthy` unless /readyz answers 200 before ``timeout``."""
    _install_unit(release)
    _systemctl("reset-failed", UNIT_NAME, check=False)
    last_exit = _unit("ExecMainExitTimestampMonotonic").get("ExecMainExitTimestampMonotonic", "0")
    _systemctl("start", "--no-block", UNIT_NAME)
    source = cert_source(settings)
    verify: str | bool = str(source.ca) if source is not None and source.ca is not None else source is None
    url = listener_url(settings, local=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if wait_ready(url, timeout=3, verify=verify):
            return
        # Any exit of the daemon now (a crash, or the watchdog's kill) is a failed start, whatever systemd does next:
        # a start clears the exit time, an exit sets a new one.
        state = _unit("ActiveState", "SubState", "ExecMainStatus", "ExecMainExitTimestampMonotonic")
        exited = state.get("ExecMainExitTimestampMonotonic", "0") not in ("0", "", last_exit)
        if state.get("ActiveState") == "failed" or exited:
            raise Unhealthy(f"the service exited at start ({state.get('SubState')}, exit status {state.get('ExecMainStatus')})")
    raise Unhealthy(f"{url}/readyz did not answer 200 within {timeout:.0f} s")


def _stop() -> None:
    _systemctl("stop", UNIT_NAME)


def _require_bundle_install(layout: Layout) -> str:
    if os.geteuid() != 0 or not systemd_is_init() or not UNIT_PATH.exists():
        raise click.ClickException(
            "upgrades from a bundle are for system mode (root, the appliance service installed); "
            "in local mode stop the daemon and run ./install.sh --bundle FILE --local"
        )
    version = layout.version_of(layout.current)
    if version is None:
        raise click.ClickException(
            f"{SYSTEM_PREFIX} was not installed from a bundle (no {layout.current}): install once with ./install.sh --bundle FILE"
        )
    return version


def upgrade_from_bundle(settings: Settings, bundle: Path, timeout: float, echo: Log = click.echo) -> None:
    layout = Layout(SYSTEM_PREFIX)
    old = _require_bundle_install(layout)
    previous_before = layout.version_of(layout.previous)
    try:
        manifest, release = unpack_verified(bundle, layout)
        if not is_newer(manifest.version, old):
            shutil.rmtree(release)
            raise BundleRefused(f"the bundle holds appliance {manifest.version}, not newer than the running {old}")
        echo(f"Bundle verified: appliance {manifest.version} ({manifest.flavour} engine); running {old}.")
    except BundleRefused as exc:
        raise click.ClickException(f"bundle refused: {exc.reason}") from None
    try:
        install_debs(release, echo)
        build_venv(release, manifest, echo)
    except (BundleRefused, subprocess.CalledProcessError) as exc:
        shutil.rmtree(release, ignore_errors=True)
        reason = exc.reason if isinstance(exc, BundleRefused) else f"{' '.join(map(str, exc.cmd))} exited {exc.returncode}"
        raise click.ClickException(f"the new release could not be prepared ({reason}); {old} runs on, untouched") from None
    echo("Stopping the service and backing up the database ...")
    _stop()
    revision = db_revision(settings.db_path)
    saved = back_up(settings, time.strftime(f"pre-upgrade-{old}-to-{manifest.version}-%Y%m%d-%H%M%S.db", time.gmtime()))
    echo(f"Database backed up to {saved} (schema {revision}).")
    record = {"from": old, "to": manifest.version, "backup": str(saved), "revision": revision, "at": int(time.time())}
    switch(layout, manifest.version)
    try:
        start_and_check(settings, release, timeout)
    except Unhealthy as exc:
        echo(f"appliance {manifest.version} is unhealthy: {exc}. Rolling back to {old} ...")
        _stop()
        switch(layout, old)
        if previous_before is not None:
            switch_previous(layout, previous_before)
        else:
            layout.previous.unlink(missing_ok=True)
        shutil.rmtree(release, ignore_errors=True)
        restored = db_revision(settings.db_path) != revision
        if restored:
            restore_copy(settings, saved)
        try:
            start_and_check(settings, layout.release(old), timeout)
        except Unhealthy as again:
            raise click.ClickException(
                f"rolled back to {old}, which is unhealthy too: {again}; see journalctl -u {UNIT_NAME}"
            ) from None
        what = "its migrations undone from the backup" if restored else "the database untouched"
        raise click.ClickException(
            f"upgrade to {manifest.version} failed ({exc}); rolled back to {old}, {what}, serving again"
        ) from None
    (SYSTEM_PREFIX / RECORD).write_text(json.dumps(record) + "\n")
    prune(layout)
    echo(f"Upgraded {old} -> {manifest.version}; healthy. `appliancectl upgrade --rollback` returns to {old}.")


def switch_previous(layout: Layout, version: str) -> None:
    fresh = layout.previous.with_name("previous.new")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(f"releases/{version}")
    os.replace(fresh, layout.previous)


def rollback(settings: Settings, timeout: float, echo: Log = click.echo) -> None:
    """Return to the previous release; the pre-upgrade backup comes back when the upgrade changed the schema."""
    layout = Layout(SYSTEM_PREFIX)
    current = _require_bundle_install(layout)
    previous = layout.version_of(layout.previous)
    if previous is None:
        raise click.ClickException("there is no previous release to return to")
    record_path = SYSTEM_PREFIX / RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    _stop()
    if record.get("to") == current and db_revision(settings.db_path) != record.get("revision"):
        kept = back_up(settings, time.strftime(f"pre-rollback-{current}-%Y%m%d-%H%M%S.db", time.gmtime()))
        restore_copy(settings, Path(record["backup"]))
        echo(f"The schema changed in the upgrade: the database from before it is back (today's is kept in {kept}).")
    switch(layout, previous)
    try:
        start_and_check(settings, layout.release(previous), timeout)
    except Unhealthy as exc:
        raise click.ClickException(f"rolled back to {previous}, which is unhealthy: {exc}") from None
    record_path.unlink(missing_ok=True)
    echo(f"Rolled back {current} -> {previous}; healthy. `appliancectl upgrade --bundle` with {current}'s bundle returns to it.")


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Upgrade from this bundle.")
    @click.option("--rollback", "back", is_flag=True, help="Return to the release before the last upgrade from a bundle.")
    @click.option("--timeout", type=float, default=180.0, show_default=True, help="Seconds the new release has to become ready.")
    @click.pass_context
    def upgrade(ctx: click.Context, bundle: Path | None, back: bool, timeout: float) -> None:
        """Upgrade in place (migrate and restart), or from a bundle with an automatic rollback; or roll back."""
        settings = ctx.find_root().obj["settings"]
        if bundle is not None and back:
            raise click.UsageError("--bundle and --rollback exclude each other")
        if bundle is not None:
            upgrade_from_bundle(settings, bundle, timeout)
            return
        if back:
            rollback(settings, timeout)
            return
        dbmod.migrate(settings.db_path)
        click.echo(f"Database at {settings.db_path} is at the newest schema.")
        if os.geteuid() == 0 and systemd_is_init() and UNIT_PATH.exists():
            shutil.copyfile(unit_source(), UNIT_PATH)
            _systemctl("daemon-reload")
            _systemctl("restart", UNIT_NAME)
            click.echo("Service restarted.")
