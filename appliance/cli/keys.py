"""`appliancectl keys create|ls|revoke`."""

from __future__ import annotations

import datetime as dt

import click
from rich.console import Console
from rich.table import Table

from appliance.cli.client import request


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M") if ts else "-"


def register(group: click.Group) -> None:
    @group.group()
    def keys() -> None:
        """Create, list and revoke API keys."""

    @keys.command("create")
    @click.argument("name")
    @click.option(
        "--role",
        type=click.Choice(["user", "admin", "metrics"]),
        default="user",
        show_default=True,
        help="metrics: may read /metrics and nothing else (for a Prometheus scraper).",
    )
    @click.option("--priority", type=click.Choice(["interactive", "batch"]), default="interactive", show_default=True)
    @click.option("--model", "models", multiple=True, help="Allow only this model (repeatable). Default: all.")
    @click.option("--team-id", type=int)
    @click.option(
        "--expires-in-days",
        type=click.FloatRange(min=0, min_open=True, clamp=False),
        help="Days until the key stops working (more than 0). Default: never.",
    )
    @click.pass_context
    def create(
        ctx: click.Context,
        name: str,
        role: str,
        priority: str,
        models: tuple[str, ...],
        team_id: int | None,
        expires_in_days: float | None,
    ) -> None:
        """Create a key. The secret is printed once and cannot be shown again."""
        body = {
            "name": name,
            "role": role,
            "priority": priority,
            "allowed_models": list(models) or None,
            "team_id": team_id,
            "expires_in_days": expires_in_days,
        }
        key = request(ctx, "POST", "/admin/keys/", json=body)
        click.echo(
            f"Created key {key['prefix']} (id {key['id']}, role {key['role']}). Store the secret now; it is not shown again:"
        )
        click.echo(key["secret"])

    @keys.command("ls")
    @click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
    @click.pass_context
    def ls(ctx: click.Context, include_revoked: bool) -> None:
        """List keys (prefixes only)."""
        rows = request(ctx, "GET", "/admin/keys/", params={"include_revoked": include_revoked})
        table = Table("id", "prefix", "name", "role", "priority", "models", "created", "expires", "revoked")
        for r in rows:
            table.add_row(
                str(r["id"]),
                r["prefix"],
                r["name"],
                r["role"],
                r["priority"],
                ",".join(r["allowed_models"] or ["*"]),
                _when(r["created_at"]),
                _when(r["expires_at"]),
                _when(r["revoked_at"]),
            )
        Console().print(table)

    @keys.command("revoke")
    @click.argument("key")
    @click.pass_context
    def revoke(ctx: click.Context, key: str) -> None:
        """Revoke a key by id or prefix; it fails on its very next request."""
        row = request(ctx, "DELETE", f"/admin/keys/{key}")
        click.echo(f"Revoked {row['prefix']} ({row['name']}).")
