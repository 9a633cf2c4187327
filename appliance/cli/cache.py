"""`appliancectl cache stats|purge|policy`."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from appliance.cli.client import request
from appliance.store.disk import human_size


def register(group: click.Group) -> None:
    @group.group()
    def cache() -> None:
        """Inspect and purge the response cache, and set cache policies."""

    @cache.command("stats")
    @click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
    @click.pass_context
    def stats(ctx: click.Context, as_json: bool) -> None:
        """Entries, size, hit rate and hits by tier since the daemon started."""
        s = request(ctx, "GET", "/admin/cache/stats")
        if as_json:
            click.echo(json.dumps(s, indent=2))
            return
        sem = s.get("semantic") or {}
        table = Table("", "", show_header=False, box=None)
        table.add_row("enabled", "yes" if s["enabled"] else "no")
        table.add_row("entries", f"{s['entries']} of {s['max_entries']} ({human_size(s['bytes'])})")
        table.add_row("lookups", str(s["lookups"]))
        table.add_row("hit rate", f"{s['hit_rate']:.1%}")
        table.add_row("hits", f"{s['hits']} (exact {s['hits_by_tier']['exact']}, semantic {s['hits_by_tier']['semantic']})")
        table.add_row("evicted / expired / purged", f"{s['evicted']} / {s['expired']} / {s['purged']}")
        table.add_row(
            "semantic tier",
            f"{'on' if sem.get('enabled') else 'off'}, {sem.get('model') or '-'}, threshold {sem.get('threshold')}",
        )
        Console().print(table)

    @cache.command("purge")
    @click.option("--model", help="Only this model (family, family:variant or alias).")
    @click.option("--key", help="Only entries stored for this API key (id or prefix).")
    @click.option("--all", "purge_all", is_flag=True, help="Every entry.")
    @click.pass_context
    def purge(ctx: click.Context, model: str | None, key: str | None, purge_all: bool) -> None:
        """Delete cached responses."""
        if purge_all == bool(model or key):
            raise click.UsageError("give --model and/or --key, or --all")
        result = request(ctx, "POST", "/admin/cache/purge", json={"model": model, "key": key, "all": purge_all})
        click.echo(f"Purged {result['purged']} cached response{'s' if result['purged'] != 1 else ''}.")

    @cache.command("policy")
    @click.argument("scope", type=click.Choice(["global", "team", "key"]))
    @click.argument("ident", required=False)
    @click.option("--set", "policy", help="New policy as JSON, e.g. '{\"enabled\": false}' or '{\"semantic\": false}'.")
    @click.option("--clear", is_flag=True, help="Remove the policy (defaults apply).")
    @click.pass_context
    def policy(ctx: click.Context, scope: str, ident: str | None, policy: str | None, clear: bool) -> None:
        """Show or set the cache policy of the box (global), a team (id) or a key (id or prefix).

        Fields: enabled, cache_nondeterministic, semantic, semantic_threshold, share (team|key|global).
        """
        if policy is not None or clear:
            try:
                doc = None if clear else json.loads(policy or "")
            except ValueError as exc:
                raise click.BadParameter(f"not JSON: {exc}", param_hint="--set") from None
            result = request(ctx, "PUT", "/admin/cache/policy", json={"scope": scope, "id": ident, "policy": doc})
        else:
            params = {"scope": scope, **({"id": ident} if ident else {})}
            result = request(ctx, "GET", "/admin/cache/policy", params=params)
        click.echo(json.dumps(result, indent=2))
