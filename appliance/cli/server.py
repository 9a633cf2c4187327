"""`appliancectl serve` and `appliancectl config`."""

from __future__ import annotations

import sys

import click

from appliance.errors import ConfigError
from appliance.manual.config_reference import reference_markdown
from appliance.settings import SECRET_SETTINGS, load_settings


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
        """Show the configuration."""

    @config.command("show")
    @click.pass_context
    def config_show(ctx: click.Context) -> None:
        """Print the settings in effect (as the CLI reads them)."""
        settings = ctx.find_root().obj["settings"]
        for name, value in settings.model_dump(mode="json").items():
            if name in SECRET_SETTINGS and value:
                value = "(set)"
            click.echo(f"{name} = {value!r}")

    @config.command("reference")
    def config_reference() -> None:
        """Print the configuration reference as Markdown (the table of the manual's reference page)."""
        click.echo(reference_markdown())
