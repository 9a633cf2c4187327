"""`appliancectl monitoring export DIR`: the Prometheus scrape config, alert rules and Grafana dashboard for this box."""

from __future__ import annotations

import socket
from pathlib import Path

import click

from appliance.cli.client import request
from appliance.errors import ApplianceError
from appliance.monitoring.export import CA_FILE, KEY_FILE, Target, export
from appliance.settings import Settings
from appliance.tls.mode import WILDCARD_ADDRESSES, tls_mode


def box_target(settings: Settings, url: str | None, ca_file: str | None) -> Target:
    """Where a Prometheus scrapes this box: ``url`` when given, else the daemon's own listener; with a self-signed
    certificate its CA is the data dir's ``tls/ca.crt``."""
    mode = tls_mode(settings)
    ca = Path(ca_file) if ca_file else (settings.data_dir / "tls" / "ca.crt" if mode == "self-signed" else None)
    if url is None:
        host = socket.getfqdn() if settings.host in WILDCARD_ADDRESSES else settings.host
        url = f"{'http' if mode == 'off' else 'https'}://{host}:{settings.port}"
    target = Target.of(url, ca)
    if target.ca is not None and not target.ca.is_file():
        raise click.ClickException(f"no CA certificate at {target.ca}: start the daemon once (it makes it), or pass --ca-file")
    return target


def register(group: click.Group) -> None:
    @group.group("monitoring")
    def monitoring() -> None:
        """Prometheus and Grafana files for this appliance."""

    @monitoring.command("export")
    @click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--target-url", help="The appliance's URL as Prometheus reaches it. Default: this box's listener.")
    @click.option("--scrape-interval", default="15s", show_default=True, help="Prometheus scrape and rule interval.")
    @click.option("--create-key", "key_name", metavar="NAME", help=f"Create a metrics-role key NAME and write it to {KEY_FILE}.")
    @click.pass_context
    def export_cmd(ctx: click.Context, dest: Path, target_url: str | None, scrape_interval: str, key_name: str | None) -> None:
        """Write prometheus.yml, alert_rules.yml, grafana-dashboard.json (and the CA and key files) into DEST."""
        settings: Settings = ctx.obj["settings"]
        try:
            target = box_target(settings, target_url or ctx.obj.get("url"), ctx.obj.get("ca_file"))
        except ApplianceError as exc:
            raise click.ClickException(exc.message) from None
        secret = None
        if key_name is not None:
            key = request(ctx, "POST", "/admin/keys/", json={"name": key_name, "role": "metrics"})
            secret = key["secret"]
            click.echo(f"Created metrics key {key['prefix']} (id {key['id']}).")
        ttft = settings.latency_targets["interactive"]["ttft_p95_s"]
        for path in export(dest, target, scrape_interval=scrape_interval, key=secret, ttft_target_s=ttft):
            click.echo(f"wrote {path}")
        if secret is None and not (dest / KEY_FILE).exists():
            click.echo(
                f"Put a metrics key in {dest / KEY_FILE} (mode 0600): appliancectl keys create prometheus --role metrics, "
                "or run this again with --create-key prometheus."
            )
        click.echo(
            f"Prometheus scrapes {target.scheme}://{target.address}/metrics" + (f" trusting {CA_FILE}." if target.ca else ".")
        )
