"""`appliancectl quota set|show`, `usage`, `prices set|show`, `teams create|ls|rename`.

Subjects: ``key:<id or prefix>``, ``team:<name>``; a bare ``ak_…`` prefix or a
number means a key, any other bare name a team.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

import click
from rich.console import Console
from rich.table import Table

from appliance.cli.client import request
from appliance.metering.quotas import DIMENSIONS

MEASURES = ("requests", "failed", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "energy_joules")
OWNER_MEASURES = ("owner_cost",)  # present when the box's costs are set (box_cost_per_hour, energy_price_per_kwh)
GROUP_COLUMNS = {"key": ("key", "key_name"), "team": ("team",), "model": ("model",), "day": ("day",), "hour": ("hour",)}


def subject_of(value: str) -> str:
    if value.startswith(("key:", "team:")):
        return value
    if value.startswith("ak_") or value.isdigit():
        return f"key:{value}"
    return f"team:{value}"


class _Limit(click.ParamType):
    """A non-negative number, or ``none`` to remove the limit."""

    name = "N|none"

    def __init__(self, money: bool = False):
        self.money = money

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float | int | None:
        if value is None or str(value).lower() in ("none", "off", "unlimited"):
            return None
        try:
            number = float(str(value)) if self.money else int(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a {'number' if self.money else 'whole number'} or 'none'", param, ctx)
        if number < 0:
            self.fail("limits cannot be negative", param, ctx)
        return number


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if not value.is_integer() else str(int(value))
    return str(value)


# A limit's state in the current window (``get_quota``'s ``usage.<dimension>.state``).
_STATES = {"ok": "ok", "reached": "limit reached", "over": "OVER LIMIT"}


def _print_quota(body: dict) -> None:
    table = Table(
        "limit", "value", "spent", "reserved", "remaining", "state", "resets", title=body.get("label") or body["subject"]
    )
    usage = body.get("usage", {})
    for d in DIMENSIONS:
        u = usage.get(d.name, {})
        table.add_row(
            d.name,
            _fmt(body["limits"].get(d.name)) if body["limits"].get(d.name) is not None else "unlimited",
            _fmt(u.get("spent")),
            _fmt(u.get("reserved")),
            _fmt(u.get("remaining")),
            _STATES.get(str(u.get("state")), "-"),
            _when(u.get("resets_at")),
        )
    alert = body.get("alert_percent")
    table.caption = f"budget alert at {_fmt(alert)}%" if alert is not None else "budget alert at the default share"
    Console().print(table)


def _print_box(body: dict) -> None:
    """The box now: attainment per model and class, and tokens, busy share, owner cost and headroom per model."""
    windows, currency = body["windows"], body.get("currency", "")
    table = Table("window", "model", "class", "requests", "within targets", "ttft_p95_s", "tpot_p95_s", title="latency targets")
    for name, w in windows.items():
        for a in w["attainment"]:
            share = f"{a['share'] * 100:.1f}%"
            table.add_row(name, a["model"], a["class"], str(a["requests"]), share, _fmt(a["ttft_p95_s"]), _fmt(a["tpot_p95_s"]))
    Console().print(table)
    title = f"engines (owner cost in {currency})"
    table = Table("window", "model", "tokens_produced", "busy", "cost_per_million", "headroom_tps", title=title)
    for name, w in windows.items():
        table.add_row(name, "all", str(w["tokens_produced"]), "", _fmt(w["owner_cost_per_million"]), "")
        for model, m in w["models"].items():
            busy = f"{m['utilisation'] * 100:.1f}%"
            table.add_row(
                name, model, str(m["tokens_produced"]), busy, _fmt(m["owner_cost_per_million"]), _fmt(m["headroom_tps"])
            )
    Console().print(table)


def register(group: click.Group) -> None:
    # -- quota ---------------------------------------------------------------------------
    @group.group()
    def quota() -> None:
        """Show and set quotas of keys and teams."""

    @quota.command("set")
    @click.argument("subject")
    @click.option("--requests-per-minute", type=_Limit())
    @click.option("--tokens-per-minute", type=_Limit())
    @click.option("--tokens-per-day", type=_Limit())
    @click.option("--tokens-per-month", type=_Limit())
    @click.option("--cost-per-month", type=_Limit(money=True))
    @click.option("--max-concurrent", type=_Limit())
    @click.option(
        "--alert-percent",
        type=_Limit(money=True),
        help="Raise a budget alert at this share (%) of a daily or monthly budget; 'none': the default.",
    )
    @click.pass_context
    def quota_set(ctx: click.Context, subject: str, **limits: float | int | None) -> None:
        """Set limits of KEY_OR_TEAM; 'none' removes one, options left out keep their value."""
        source = ctx.get_parameter_source
        body = {name: value for name, value in limits.items() if source(name) == click.core.ParameterSource.COMMANDLINE}
        if not body:
            raise click.UsageError("give at least one limit, e.g. --tokens-per-day 100000")
        _print_quota(request(ctx, "PUT", f"/admin/quotas/{subject_of(subject)}", json=body))

    @quota.command("show")
    @click.argument("subject")
    @click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
    @click.pass_context
    def quota_show(ctx: click.Context, subject: str, as_json: bool) -> None:
        """Limits of KEY_OR_TEAM and what is spent in the current windows."""
        body = request(ctx, "GET", f"/admin/quotas/{subject_of(subject)}")
        if as_json:
            click.echo(json.dumps(body, indent=2))
        else:
            _print_quota(body)

    # -- usage ---------------------------------------------------------------------------
    @group.command()
    @click.option("--by", default="", help="Group by key, team, model, day or hour (comma-separated).")
    @click.option("--since", help="Start: ISO date/time, epoch seconds or an age like 7d (default 30 days ago).")
    @click.option("--until", help="End (default now).")
    @click.option("--key", help="Only this key (id or prefix).")
    @click.option("--team", help="Only this team.")
    @click.option("--model", help="Only this model or family.")
    @click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
    @click.pass_context
    def usage(
        ctx: click.Context,
        by: str,
        since: str | None,
        until: str | None,
        key: str | None,
        team: str | None,
        model: str | None,
        fmt: str,
    ) -> None:
        """Usage and cost from the ledger."""
        params = {
            k: v for k, v in {"by": by, "since": since, "until": until, "key": key, "team": team, "model": model}.items() if v
        }
        params["format"] = "csv" if fmt == "csv" else "json"
        body = request(ctx, "GET", "/admin/usage", params=params)
        if fmt == "csv":
            sys.stdout.write(body)
            return
        if fmt == "json":
            click.echo(json.dumps(body, indent=2))
            return
        columns = [c for b in body["by"] for c in GROUP_COLUMNS[b]]
        measures = MEASURES + tuple(c for c in OWNER_MEASURES if c in body["totals"])
        table = Table(*columns, *measures, title=f"usage {_when(body['since'])} – {_when(body['until'])}")
        for row in body["rows"]:
            table.add_row(*(_fmt(row.get(c)) for c in columns), *(_fmt(row.get(m)) for m in measures))
        if body["by"] and body["rows"]:
            table.add_row(*(["total"] + [""] * (len(columns) - 1)), *(_fmt(body["totals"].get(m)) for m in measures))
        Console().print(table)
        _print_box(request(ctx, "GET", "/admin/usage/box"))
        if "owner_cost_per_million" in body["totals"]:
            per_million = body["totals"]["owner_cost_per_million"]
            click.echo(
                f"Owner cost (box_cost_per_hour and energy) per million tokens produced in this range: "
                f"{_fmt(per_million)} {body.get('currency', '')}".rstrip()
            )

    # -- prices --------------------------------------------------------------------------
    @group.group()
    def prices() -> None:
        """Prices per million tokens, by model ('*', family or family:variant)."""

    @prices.command("set")
    @click.argument("model")
    @click.option("--input", "input_per_m", type=float, help="Per million prompt tokens.")
    @click.option("--output", "output_per_m", type=float, help="Per million completion tokens.")
    @click.option("--cached", "cached_per_m", type=float, help="Per million tokens served from a cache.")
    @click.pass_context
    def prices_set(ctx: click.Context, model: str, **rates: float | None) -> None:
        """Set the price of MODEL ('*' is the default for every model)."""
        body = {k: v for k, v in rates.items() if v is not None}
        if not body:
            raise click.UsageError("give at least one of --input, --output, --cached")
        row = request(ctx, "PUT", f"/admin/prices/{model}", json=body)
        click.echo(
            f"{row['model']}: input {_fmt(row['input_per_m'])}, output {_fmt(row['output_per_m'])}, "
            f"cached {_fmt(row['cached_per_m'])} per 1M tokens"
        )

    @prices.command("show")
    @click.argument("model", required=False)
    @click.pass_context
    def prices_show(ctx: click.Context, model: str | None) -> None:
        """All prices, or the price row of MODEL."""
        rows = [request(ctx, "GET", f"/admin/prices/{model}")] if model else request(ctx, "GET", "/admin/prices")
        table = Table("model", "input / 1M", "output / 1M", "cached / 1M")
        for r in rows:
            table.add_row(r["model"], _fmt(r["input_per_m"]), _fmt(r["output_per_m"]), _fmt(r["cached_per_m"]))
        Console().print(table)

    # -- teams ---------------------------------------------------------------------------
    @group.group()
    def teams() -> None:
        """Teams group keys under shared quotas."""

    @teams.command("create")
    @click.argument("name")
    @click.pass_context
    def teams_create(ctx: click.Context, name: str) -> None:
        team = request(ctx, "POST", "/admin/teams", json={"name": name})
        click.echo(f"Created team {team['name']} (id {team['id']}).")

    @teams.command("rename")
    @click.argument("name")
    @click.argument("new_name")
    @click.pass_context
    def teams_rename(ctx: click.Context, name: str, new_name: str) -> None:
        """Rename team NAME to NEW_NAME; its keys, limits and past usage follow."""
        team = request(ctx, "PATCH", f"/admin/teams/{name}", json={"name": new_name})
        click.echo(f"Renamed team {name} to {team['name']} (id {team['id']}).")

    @teams.command("ls")
    @click.pass_context
    def teams_ls(ctx: click.Context) -> None:
        table = Table("id", "name", "keys", "created")
        for t in request(ctx, "GET", "/admin/teams"):
            table.add_row(str(t["id"]), t["name"], str(t["keys"]), _when(t["created_at"]))
        Console().print(table)
