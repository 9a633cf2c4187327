"""`appliancectl backup PATH` and `appliancectl restore PATH` (online, through the daemon)."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.cli.client import request


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
    @click.pass_context
    def backup(ctx: click.Context, path: Path) -> None:
        """Write a consistent copy of the database to PATH while the daemon runs."""
        result = request(ctx, "POST", "/admin/ops/backup", json={"path": str(path.resolve())})
        click.echo(f"Backed up {result['bytes'] / 2**20:.1f} MiB to {result['path']} in {result['seconds']} s.")

    @group.command()
    @click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.pass_context
    def restore(ctx: click.Context, path: Path, yes: bool) -> None:
        """Replace the database with the backup at PATH (keys, usage, quotas...), migrating it forward."""
        if not yes:
            click.confirm("Replace the live database with this backup? Changes since it was made are lost", abort=True)
        result = request(ctx, "POST", "/admin/ops/restore", json={"path": str(path.resolve())})
        click.echo(f"Restored {result['path']} in {result['seconds']} s.")
