"""`appliancectl backup [NAME]` and `appliancectl restore BACKUP` (online, through the daemon's admin socket)."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.cli.client import request


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("name", required=False)
    @click.pass_context
    def backup(ctx: click.Context, name: str | None) -> None:
        """Write a consistent copy of the database to <data dir>/backups/NAME while the daemon runs.

        NAME is a plain file name (a timestamped one when left out); an existing backup is never replaced."""
        if name is None:
            body: dict[str, str] = {}
        elif "/" in name:  # the daemon accepts a path only when it names a file directly in the backups folder
            body = {"path": str(Path(name).resolve())}
        else:
            body = {"name": name}
        result = request(ctx, "POST", "/admin/ops/backup", json=body)
        click.echo(f"Backed up {result['bytes'] / 2**20:.1f} MiB to {result['path']} in {result['seconds']} s.")

    @group.command()
    @click.argument("backup")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.pass_context
    def restore(ctx: click.Context, backup: str, yes: bool) -> None:
        """Replace the database with BACKUP (keys, usage, quotas...), migrating it forward.

        BACKUP is the name of a file in <data dir>/backups, or the path of any readable file (a path
        containing '/', or a file that exists here). The daemon checks it before the live database is
        touched: integrity, and exactly the appliance's schema, with no triggers or views."""
        body = {"path": str(Path(backup).resolve())} if "/" in backup or Path(backup).exists() else {"name": backup}
        if not yes:
            click.confirm("Replace the live database with this backup? Changes since it was made are lost", abort=True)
        result = request(ctx, "POST", "/admin/ops/restore", json=body)
        click.echo(f"Restored {result['path']} in {result['seconds']} s.")
