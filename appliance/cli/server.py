"""`appliancectl serve` and `appliancectl config` (show, set, reference)."""

from __future__ import annotations

import sys

import click

from appliance.cli.client import daemon_reachable, request
from appliance.db.audit import AuditTrail
from appliance.db.engine import make_engine
from appliance.errors import ApplianceError, ConfigError
from appliance.manual.config_reference import reference_markdown
from appliance.settings import load_settings
from appliance.settings.config_file import config_file_path
from appliance.settings.editor import shown, text_value
from appliance.settings.runtime import RuntimeSettings


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--host", help="Listen address (default: APPLIANCE_HOST or 127.0.0.1).")
    @click.option("--port", type=int, help="Listen port (default: APPLIANCE_PORT or 8080).")
    def serve(host: str | None, port: int | None) -> None:
        """Run the daemon in the foreground."""
        from appliance.daemon import run

        overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
        try:
            settings = load_settings(**overrides)
        except ConfigError as exc:
            raise click.ClickException(exc.message) from None
        sys.exit(run(settings))

    @group.group()
    def config() -> None:
        """Show and change the configuration."""

    @config.command("show")
    @click.pass_context
    def config_show(ctx: click.Context) -> None:
        """Print every setting: from the running daemon (value, source, when a change applies, pending restarts),
        or as this CLI reads the config when the daemon is not running."""
        if daemon_reachable(ctx):
            answer = request(ctx, "GET", "/admin/settings/")
            assert isinstance(answer, dict)
            for row in answer["settings"]:
                pending = f"; pending restart: {row['pending_value']!r}" if row["pending_restart"] else ""
                click.echo(f"{row['name']} = {row['value']!r}  ({row['source']}; {row['applies']}{pending})")
            return
        click.echo("# the daemon is not running: the settings as this CLI reads them", err=True)
        settings = ctx.find_root().obj["settings"]
        for name in type(settings).model_fields:
            click.echo(f"{name} = {shown(name, getattr(settings, name))!r}  ({settings.origin(name).source})")

    @config.command("set")
    @click.argument("key")
    @click.argument("value")
    @click.pass_context
    def config_set(ctx: click.Context, key: str, value: str) -> None:
        """Set KEY to VALUE (text for text settings, JSON for the others; "" for the default). Through the running
        daemon when it runs (applied at once where the setting is live); else written into the config file, for the
        next start."""
        try:
            typed = text_value(key, value)
        except ApplianceError as exc:
            raise click.ClickException(exc.message) from None
        if daemon_reachable(ctx):
            answer = request(ctx, "PATCH", "/admin/settings/", json={key: typed})
            assert isinstance(answer, dict)
            for change in answer["changed"]:
                when = "applied now" if change["applies"] == "live" else "applies at the next restart"
                click.echo(f"{change['name']}: {change['before']!r} -> {change['after']!r} ({when})")
            return
        settings = ctx.find_root().obj["settings"]
        if not settings.db_path.exists():
            raise click.ClickException(f"no database in {settings.data_dir}: start the daemon once, then change settings")
        trail = AuditTrail(make_engine(settings.db_path))
        runtime = RuntimeSettings(settings, trail, config_file_path())
        try:
            [change] = runtime.change("local-admin", {key: typed})
        except ApplianceError as exc:
            raise click.ClickException(exc.message) from None
        click.echo(
            f"{key}: {shown(key, change.before)!r} -> {shown(key, change.after)!r} (the daemon is not running: written "
            f"to {runtime.config_path}, used at its next start)"
        )

    @config.command("reference")
    def config_reference() -> None:
        """Print the configuration reference as Markdown (the table of the manual's reference page)."""
        click.echo(reference_markdown())
