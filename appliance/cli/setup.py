"""`appliancectl install|upgrade|uninstall`: everything after install.sh made the venv.

System mode (root, systemd as PID 1): the `appliance` user, /var/lib/appliance,
/etc/appliance/appliance.toml and the hardened unit, enabled and started.
Local mode: a data dir in the current folder and the daemon in the foreground.
Both install the default model from its package, verify it, and create the
first admin with a one-time password.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import httpx

from appliance.cli.initial_password import initial_admin_password, password_file
from appliance.db import engine as dbmod
from appliance.errors import ConfigError
from appliance.settings import SYSTEM_CONFIG_PATH, Settings, load_settings
from appliance.tls.certinfo import CertInfo
from appliance.tls.context import cert_source, prepare
from appliance.tls.mode import tls_mode

SYSTEM_DATA_DIR = Path("/var/lib/appliance")
SYSTEM_PREFIX = Path("/opt/appliance")
UNIT_NAME = "appliance.service"
UNIT_PATH = Path("/etc/systemd/system") / UNIT_NAME
SERVICE_USER = "appliance"


def systemd_is_init() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def unit_source(package_dir: Path | None = None, prefix: Path = SYSTEM_PREFIX) -> Path:
    """The hardened unit file, ``systemd/appliance.service`` in the sources.

    It is installed as package data (``appliance/systemd/appliance.service`` in
    site-packages), so an installed, non-editable venv such as
    /opt/appliance/venv finds it beside its own modules; a source checkout
    (an editable install) finds the top-level ``systemd/`` folder; the copy of
    the sources install.sh leaves in ``<prefix>/src`` is the last fallback.
    """
    package_dir = package_dir or Path(__file__).resolve().parents[1]
    candidates = [
        package_dir / "systemd" / UNIT_NAME,
        package_dir.parent / "systemd" / UNIT_NAME,
        prefix / "src" / "systemd" / UNIT_NAME,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise click.ClickException(f"{UNIT_NAME} not found (looked in {', '.join(str(c.parent) for c in candidates)})")


def prepare_data(settings, echo=click.echo) -> str | None:
    """Migrate the database, install and verify the default model, create the first admin."""
    from appliance.daemon import check_data_dir
    from appliance.store.default_model import seed_default_model
    from appliance.store.store import ModelStore

    check_data_dir(settings)
    dbmod.migrate(settings.db_path)
    engine = dbmod.make_engine(settings.db_path)
    try:
        echo(f"Installing the default model {settings.default_model} into {settings.store_dir} ...")
        store = ModelStore(settings, engine)
        seed_default_model(settings, store)
        variant = store.resolve(settings.default_model)
        echo(f"Default model ready: {variant.name} (sha256 verified).")
        return initial_admin_password(settings, engine)
    finally:
        engine.dispose()


def wait_ready(url: str, timeout: float = 180.0, verify: str | bool = True) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2.0, verify=verify).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return False


def prepare_tls(settings: Settings) -> CertInfo | None:
    """Make (self-signed) or check (admin's files) the HTTPS certificate before the daemon starts; None with TLS off."""
    if tls_mode(settings) == "off":
        return None
    try:
        return prepare(settings)[1]
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None


def listener_url(settings: Settings, local: bool = False) -> str:
    """The URL to print or probe: https with TLS on; 127.0.0.1 when it listens on every address (or with ``local``)."""
    scheme = "http" if tls_mode(settings) == "off" else "https"
    host = "127.0.0.1" if local or settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{settings.port}"


def announce(
    url: str, password: str | None, saved: Path | None = None, cert: CertInfo | None = None, ca: Path | None = None
) -> None:
    click.echo("")
    click.echo(f"Console: {url}/")
    click.echo(f"API:     {url}/v1  (OpenAI-compatible; create a key with `appliancectl keys create NAME`)")
    if cert is not None:
        click.echo(f"HTTPS certificate SHA-256 fingerprint: {cert.fingerprint}")
        click.echo(f"         valid until {cert.not_after:%Y-%m-%d}; names: {', '.join(cert.names)}")
        if ca is not None:
            click.echo(f"         clients trust it through the box's CA: {ca} (copy it to them; compare the fingerprint)")
    if password:
        click.echo(f"First sign-in: user `admin`, one-time password `{password}` (you will be asked to change it).")
        if saved is not None:
            click.echo(f"Until it is changed it is also kept in {saved} (mode 0600) and shown again on each re-run.")
    else:
        click.echo("An admin user already exists; its password was kept.")


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True)


def write_system_config(path: Path, overrides: dict) -> None:
    """Create the service's config file, and record ``--host``/``--port`` in it.

    The service reads only this file, so a listen address given to
    ``install --system`` must land here (an existing file keeps its other lines);
    otherwise the service would listen on the old one while the installer waits
    on the new.
    """
    existing = path.read_text() if path.exists() else None
    lines = (
        existing.splitlines() if existing is not None else [f'data_dir = "{SYSTEM_DATA_DIR}"', 'host = "0.0.0.0"', "port = 8080"]
    )
    # Top-level keys are the lines before the first [table] header; a `port` inside a table is another setting.
    top = next((i for i, line in enumerate(lines) if re.match(r"\s*\[", line)), len(lines))
    for key in ("host", "port"):
        if key not in overrides:
            continue
        entry = f"{key} = {json.dumps(overrides[key])}"
        at = next((i for i, line in enumerate(lines[:top]) if re.match(rf"\s*{key}\s*=", line)), None)
        if at is None:
            lines.insert(0, entry)  # top-level keys go before any [table]
            top += 1
        else:
            lines[at] = entry
    text = "\n".join(lines) + "\n"
    if text == existing:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o640)


def install_system(settings_overrides: dict) -> None:
    if os.geteuid() != 0:
        raise click.ClickException("--system needs root")
    if not systemd_is_init():
        raise click.ClickException("--system needs systemd as PID 1; use --local here")
    if subprocess.run(["id", "-u", SERVICE_USER], capture_output=True).returncode != 0:
        _run("useradd", "--system", "--home-dir", str(SYSTEM_DATA_DIR), "--shell", "/usr/sbin/nologin", SERVICE_USER)
    for group in ("video", "render"):
        if subprocess.run(["getent", "group", group], capture_output=True).returncode == 0:
            _run("usermod", "-aG", group, SERVICE_USER)
    write_system_config(SYSTEM_CONFIG_PATH, settings_overrides)
    os.environ["APPLIANCE_CONFIG"] = str(SYSTEM_CONFIG_PATH)
    settings = load_settings(**settings_overrides)
    password = prepare_data(settings)
    cert = prepare_tls(settings)
    _run("chown", "-R", f"{SERVICE_USER}:{SERVICE_USER}", str(settings.data_dir))
    if password_file(settings).is_file():
        os.chown(password_file(settings), 0, 0)  # root's alone, not the service's
    # The service's group may rewrite the config file (settings changed from the console), never anyone else.
    _run("chgrp", SERVICE_USER, str(SYSTEM_CONFIG_PATH.parent), str(SYSTEM_CONFIG_PATH))
    os.chmod(SYSTEM_CONFIG_PATH.parent, 0o770)
    os.chmod(SYSTEM_CONFIG_PATH, 0o660)
    shutil.copyfile(unit_source(), UNIT_PATH)
    _run("systemctl", "daemon-reload")
    _run("systemctl", "enable", UNIT_NAME)
    _run("systemctl", "restart", UNIT_NAME)
    local_url = listener_url(settings, local=True)
    source = cert_source(settings)
    verify: str | bool = True
    if source is not None:  # the box's own certificate names 127.0.0.1; an admin's may not, and the probe sends no secret
        verify = str(source.ca) if source.ca is not None else False
    click.echo("Waiting for the appliance to become ready ...")
    if not wait_ready(local_url, verify=verify):
        hint = f"; the first admin's one-time password is kept in {password_file(settings)}" if password else ""
        raise click.ClickException(f"the service did not become ready; see `journalctl -u {UNIT_NAME}`{hint}")
    announce(listener_url(settings), password, password_file(settings) if password else None, cert, source.ca if source else None)


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--system", "mode", flag_value="system", help="Install as a systemd service (root, systemd hosts).")
    @click.option("--local", "mode", flag_value="local", help="Run from this folder in the foreground.")
    @click.option("--no-serve", is_flag=True, help="Local mode: prepare everything but do not start the daemon.")
    @click.option("--host", help="Listen address.")
    @click.option("--port", type=int, help="Listen port.")
    def install(mode: str | None, no_serve: bool, host: str | None, port: int | None) -> None:
        """Install (or upgrade in place): database, default model, first admin, service."""
        overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
        if mode is None:
            mode = "system" if os.geteuid() == 0 and systemd_is_init() else "local"
        if mode == "system":
            install_system(overrides)
            return
        settings = load_settings(**overrides)
        password = prepare_data(settings)
        cert, source = prepare_tls(settings), cert_source(settings)
        announce(
            listener_url(settings), password, password_file(settings) if password else None, cert, source.ca if source else None
        )
        if no_serve:
            return
        from appliance.daemon import run

        click.echo(f"Data dir: {settings.data_dir}. Starting the appliance in the foreground (Ctrl-C stops it) ...")
        sys.exit(run(settings))

    @group.command()
    @click.option("--purge", is_flag=True, help="Also delete the data dir (database and models) and the config.")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.pass_context
    def uninstall(ctx: click.Context, purge: bool, yes: bool) -> None:
        """Remove the service. Data is kept unless --purge is given."""
        settings = ctx.find_root().obj["settings"]
        if purge and not yes:
            click.confirm(f"Delete {settings.data_dir} with every model and the usage ledger?", abort=True)
        if os.geteuid() == 0 and systemd_is_init() and UNIT_PATH.exists():
            subprocess.run(["systemctl", "disable", "--now", UNIT_NAME], check=False)
            UNIT_PATH.unlink(missing_ok=True)
            subprocess.run(["systemctl", "daemon-reload"], check=False)
            if SYSTEM_PREFIX.exists():
                shutil.rmtree(SYSTEM_PREFIX)
            click.echo("Service removed.")
        if purge:
            shutil.rmtree(settings.data_dir, ignore_errors=True)
            if SYSTEM_CONFIG_PATH.exists() and os.geteuid() == 0:
                SYSTEM_CONFIG_PATH.unlink()
            click.echo(f"Deleted {settings.data_dir}.")
        else:
            click.echo(f"Data kept in {settings.data_dir}.")
