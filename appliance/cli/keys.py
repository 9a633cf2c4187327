"""`appliancectl keys create|ls|revoke|rotate|expire|expiring`."""

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
        """Create, list, rotate, expire and revoke API keys."""

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

    @keys.command("rotate")
    @click.argument("key")
    @click.option(
        "--overlap-hours",
        type=click.FloatRange(min=0, max=168),
        default=24.0,
        show_default=True,
        help="How long the old secret keeps working (0: refused at once; at most 168, 7 days).",
    )
    @click.pass_context
    def rotate(ctx: click.Context, key: str, overlap_hours: float) -> None:
        """Give KEY (id or prefix) a new secret; it keeps its name, team, limits, quotas, expiry and usage.

        The new secret is printed once. The old one works until the overlap ends, then gets 401 "rotated"."""
        row = request(ctx, "POST", f"/admin/keys/{key}/rotate", json={"overlap_hours": overlap_hours})
        click.echo(
            f"Rotated {row['name']}: new prefix {row['prefix']}; the old secret ({row['old_prefix']}…) works until"
            f" {_when(row['old_valid_until'])} UTC. Store the new secret now; it is not shown again:"
        )
        click.echo(row["secret"])

    @keys.command("expire")
    @click.argument("key")
    @click.option("--in-days", type=click.FloatRange(min=0, min_open=True), help="Expire this many days from now.")
    @click.option("--at", "at", type=click.DateTime(), help="Expire at this moment (UTC), e.g. 2027-01-31T18:00.")
    @click.option("--never", is_flag=True, help="Clear the expiry: the key never expires.")
    @click.pass_context
    def expire(ctx: click.Context, key: str, in_days: float | None, at: dt.datetime | None, never: bool) -> None:
        """Set or clear the expiry of KEY (id or prefix); an expiry is always in the future."""
        if sum((in_days is not None, at is not None, never)) != 1:
            raise click.UsageError("give exactly one of --in-days, --at or --never")
        body: dict[str, float | None]
        if never:
            body = {"expires_at": None}
        elif at is not None:
            body = {"expires_at": at.replace(tzinfo=dt.UTC).timestamp()}
        else:
            body = {"expires_in_days": in_days}
        row = request(ctx, "PATCH", f"/admin/keys/{key}", json=body)
        when = f"expires {_when(row['expires_at'])} UTC" if row["expires_at"] else "never expires"
        click.echo(f"{row['name']} ({row['prefix']}…) {when}.")

    @keys.command("expiring")
    @click.option("--within-days", type=click.FloatRange(min=0, min_open=True), default=14.0, show_default=True)
    @click.pass_context
    def expiring(ctx: click.Context, within_days: float) -> None:
        """Keys expiring soon, and old secrets still in their rotation overlap."""
        rows = request(ctx, "GET", "/admin/keys/expiring", params={"within_days": within_days})
        table = Table("key", "what", "stops working (UTC)", "days left")
        for r in rows:
            what = "old secret (rotated)" if r["what"] == "old_secret" else "key expires"
            table.add_row(r["label"], what, _when(r["at"]), f"{r['days_left']:.1f}")
        Console().print(table)
