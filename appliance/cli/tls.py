"""`appliancectl tls show|reload`: the certificate the daemon serves, and loading new files without a restart."""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from urllib.parse import urlsplit

import click
from cryptography import x509

from appliance.settings import Settings
from appliance.tls.certinfo import CertInfo, info
from appliance.tls.context import served_certificate
from appliance.tls.mode import tls_mode


def presented_certificate(url: str, timeout: float = 10.0) -> CertInfo:
    """The certificate an https URL presents (read without trusting it: for showing its fingerprint only)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise click.ClickException(f"{url} is not an https URL")
    try:
        pem = ssl.get_server_certificate((parts.hostname, parts.port or 443), timeout=timeout)
    except OSError as exc:
        raise click.ClickException(f"cannot read the certificate of {url}: {exc}") from None
    return info(x509.load_pem_x509_certificate(pem.encode()))


def certificate_report(settings: Settings, url: str | None) -> dict[str, object]:
    """The ``tls`` part of ``doctor``: the mode and the served certificate (the file here, or what ``url`` presents)."""
    if url:
        if not url.startswith("https://"):
            return {"mode": "off", "certificate": None}
        return {"mode": "remote", "certificate": presented_certificate(url).as_json()}
    cert = served_certificate(settings)
    return {"mode": tls_mode(settings), "certificate": cert.as_json() if cert else None}


def certificate_lines(report: dict[str, object]) -> list[str]:
    cert = report.get("certificate")
    if not isinstance(cert, dict):
        return [
            f"TLS:   {report.get('mode')} (plain HTTP)"
            if report.get("mode") == "off"
            else f"TLS:   {report.get('mode')}, no certificate yet"
        ]
    warn = "  EXPIRES SOON: replace it" if float(cert["days_left"]) <= 30 else ""
    return [
        f"TLS:   {report['mode']}, certificate SHA-256 {cert['fingerprint_sha256']}",
        f"       {cert['subject']}, issued by {cert['issuer']}",
        f"       valid until {cert['not_after']} ({cert['days_left']:.0f} days){warn}; names: {', '.join(cert['names'])}",
    ]


def daemon_pid(settings: Settings) -> int:
    """The pid of the daemon holding this data dir's lock, or a ClickException when none runs."""
    import fcntl

    try:
        fd = os.open(settings.lock_path, os.O_RDONLY)
    except OSError:
        raise click.ClickException(f"the appliance is not running for data dir {settings.data_dir}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return int(os.read(fd, 32).decode().strip())
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise click.ClickException(f"the appliance is not running for data dir {settings.data_dir}")
    finally:
        os.close(fd)


def register(group: click.Group) -> None:
    @group.group("tls")
    def tls_group() -> None:
        """The daemon's HTTPS certificate."""

    @tls_group.command("show")
    @click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
    @click.pass_context
    def show(ctx: click.Context, as_json: bool) -> None:
        """Show the served certificate's SHA-256 fingerprint, names and expiry (with --url: what that URL presents)."""
        obj = ctx.find_root().obj or {}
        report = certificate_report(obj["settings"], obj.get("url"))
        click.echo(json.dumps(report, indent=2) if as_json else "\n".join(certificate_lines(report)))

    @tls_group.command("reload")
    @click.pass_context
    def reload(ctx: click.Context) -> None:
        """Load the certificate files again (SIGHUP to the daemon on this box): new connections get the new
        certificate, open ones keep theirs. Files that fail the checks are refused and the old certificate stays."""
        settings: Settings = ctx.find_root().obj["settings"]
        if tls_mode(settings) == "off":
            raise click.ClickException("TLS is off for this data dir (the tls setting)")
        before = served_certificate(settings)
        pid = daemon_pid(settings)
        try:
            os.kill(pid, signal.SIGHUP)
        except PermissionError:
            raise click.ClickException(f"not allowed to signal the daemon (pid {pid}); run as its user or root") from None
        time.sleep(0.5)
        after = served_certificate(settings)
        click.echo(f"Asked the daemon (pid {pid}) to reload its certificate; the log says whether the files were accepted.")
        if after is not None:
            same = before is not None and before.fingerprint == after.fingerprint
            click.echo(
                f"Certificate file: SHA-256 {after.fingerprint}{' (unchanged)' if same else ''}, valid until {after.not_after}"
            )
