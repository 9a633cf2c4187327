"""`appliancectl models load|unload|pin|ps`: loaded instances."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from appliance.cli.client import request, subgroup


def register(group: click.Group) -> None:
    models = subgroup(group, "models", "Manage models.")

    @models.command("load")
    @click.argument("model")
    @click.option("--pin", is_flag=True, help="Never evict or idle-unload it.")
    @click.pass_context
    def load(ctx: click.Context, model: str, pin: bool) -> None:
        """Load MODEL now (it would load on first request anyway)."""
        info = request(ctx, "POST", f"/admin/instances/{model}/load", params={"pin": pin})
        click.echo(f"Loaded {info['model']} on {info['backend']} ({info['slots']} slots, context {info['context']}).")

    @models.command("unload")
    @click.argument("model")
    @click.pass_context
    def unload(ctx: click.Context, model: str) -> None:
        """Unload MODEL and free its memory."""
        info = request(ctx, "POST", f"/admin/instances/{model}/unload")
        click.echo(f"Unloaded {model}." if info["unloaded"] else f"{model} was not loaded.")

    @models.command("pin")
    @click.argument("model")
    @click.option("--off", is_flag=True, help="Unpin instead.")
    @click.pass_context
    def pin(ctx: click.Context, model: str, off: bool) -> None:
        """Pin a loaded MODEL so it is never evicted or idle-unloaded."""
        info = request(ctx, "POST", f"/admin/instances/{model}/pin", params={"pinned": not off})
        click.echo(f"{info['model']} is {'pinned' if info['pinned'] else 'unpinned'}.")

    @models.command("ps")
    @click.pass_context
    def ps(ctx: click.Context) -> None:
        """List loaded instances."""
        rows = request(ctx, "GET", "/admin/instances/")
        table = Table("model", "backend", "state", "pinned", "busy/slots", "waiting", "requests", "RSS MiB")
        for r in rows:
            rss = f"{r['rss_bytes'] / 2**20:.0f}" if r.get("rss_bytes") else "-"
            table.add_row(
                r["model"],
                r["backend"],
                r["state"],
                "yes" if r["pinned"] else "",
                f"{r['inflight']}/{r['slots']}",
                str(r["waiting"]),
                str(r["requests"]),
                rss,
            )
        Console().print(table)
