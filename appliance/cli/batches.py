"""`appliancectl batches ls|show|cancel`: batches of every key (the admin socket and admin keys see them all)."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from appliance.cli.client import request
from appliance.jsontypes import JsonObject


def progress(batch: JsonObject) -> str:
    """``done/total (pct%), failed F``: lines with a result, of all lines."""
    counts = batch["request_counts"]
    done, total = counts["completed"] + counts["failed"], counts["total"]
    share = f" ({done / total:.0%})" if total else ""
    return f"{done}/{total}{share}" + (f", {counts['failed']} failed" if counts["failed"] else "")


def _when(stamp: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "-"


def register(group: click.Group) -> None:
    @group.group()
    def batches() -> None:
        """Inspect and cancel batches (OpenAI's Batch API)."""

    @batches.command("ls")
    @click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100), help="Most batches shown, newest first.")
    @click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
    @click.pass_context
    def ls(ctx: click.Context, limit: int, as_json: bool) -> None:
        """Batches, newest first, with their progress."""
        listing = request(ctx, "GET", "/v1/batches", params={"limit": limit})
        assert isinstance(listing, dict)
        if as_json:
            click.echo(json.dumps(listing, indent=2))
            return
        table = Table("id", "status", "endpoint", "progress", "created")
        for batch in listing["data"]:
            table.add_row(batch["id"], batch["status"], batch["endpoint"], progress(batch), _when(batch["created_at"]))
        Console().print(table)

    @batches.command("show")
    @click.argument("batch_id")
    @click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
    @click.pass_context
    def show(ctx: click.Context, batch_id: str, as_json: bool) -> None:
        """One batch: status, progress, files and times."""
        batch = request(ctx, "GET", f"/v1/batches/{batch_id}")
        assert isinstance(batch, dict)
        if as_json:
            click.echo(json.dumps(batch, indent=2))
            return
        table = Table("", "", show_header=False, box=None)
        for label, value in (
            ("id", batch["id"]),
            ("status", batch["status"]),
            ("endpoint", batch["endpoint"]),
            ("progress", progress(batch)),
            ("input file", batch["input_file_id"]),
            ("output file", batch["output_file_id"] or "-"),
            ("error file", batch["error_file_id"] or "-"),
            ("created", _when(batch["created_at"])),
            ("expires", _when(batch["expires_at"])),
            ("finished", _when(batch["completed_at"] or batch["cancelled_at"] or batch["expired_at"] or batch["failed_at"])),
        ):
            table.add_row(label, str(value))
        for error in (batch.get("errors") or {}).get("data") or []:
            table.add_row("error", f"{error.get('code')}: {error.get('message')}")
        Console().print(table)

    @batches.command("cancel")
    @click.argument("batch_id")
    @click.pass_context
    def cancel(ctx: click.Context, batch_id: str) -> None:
        """Cancel a batch: lines in flight finish, no more start; its output keeps what finished."""
        batch = request(ctx, "POST", f"/v1/batches/{batch_id}/cancel")
        assert isinstance(batch, dict)
        click.echo(f"Batch {batch['id']} is {batch['status']} ({progress(batch)}).")
