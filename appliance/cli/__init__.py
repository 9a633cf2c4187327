"""appliancectl: install, run and administer the appliance.

Subcommands live in small modules, each with a ``register(group)`` function.
"""

from __future__ import annotations

import sys

import click

from appliance import __version__
from appliance.cli import (
    batches,
    bench,
    cache,
    instances,
    keys,
    models,
    monitoring,
    ops,
    planning,
    server,
    setup,
    tls,
    upgrade,
    usage,
    users,
)
from appliance.errors import ConfigError
from appliance.settings import load_settings

SUBCOMMANDS = (
    server,
    setup,
    keys,
    users,
    models,
    instances,
    planning,
    usage,
    cache,
    batches,
    bench,
    ops,
    tls,
    monitoring,
    upgrade,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="appliancectl")
@click.option("--url", envvar="APPLIANCE_URL", help="Remote appliance URL (default: the local daemon's admin socket).")
@click.option("--api-key", envvar="APPLIANCE_API_KEY", help="Admin API key for --url.")
@click.option(
    "--ca-file",
    envvar="APPLIANCE_CA_FILE",
    type=click.Path(dir_okay=False),
    help="CA certificate(s) that an https --url's certificate must chain to (default: the data dir's tls/ca.crt when present, "
    "else the system's).",
)
@click.pass_context
def cli(ctx: click.Context, url: str | None, api_key: str | None, ca_file: str | None) -> None:
    """Administer the LLM appliance."""
    ctx.ensure_object(dict)
    ctx.obj.update(url=url, api_key=api_key, ca_file=ca_file)
    try:
        ctx.obj["settings"] = load_settings()
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None


for _module in SUBCOMMANDS:
    _module.register(cli)


def main() -> None:
    sys.exit(cli.main(prog_name="appliancectl", standalone_mode=True))
