"""`appliancectl models ls|pull|import|export|scan|rm|verify|inspect|quantize|default|cancel`: the model store.

Every command calls the running daemon's admin API. Long work (pull, import,
verify, quantize) runs there as a job; the CLI follows its SSE progress with a
progress bar (``--detach`` leaves it running), and Ctrl-C cancels it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import httpx
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from appliance.cli.client import admin_client, check, request, subgroup
from appliance.jsontypes import JsonObject
from appliance.store.disk import human_size


def _size(n: int | None) -> str:
    return human_size(n) if n else "-"


def _status(row: JsonObject) -> str:
    """The state, and for a variant available on the hub whether the planner says it would fit this box."""
    if row["status"] != "available":
        return str(row["status"])
    fit = row.get("fit")
    verdict = "fit unknown" if not isinstance(fit, dict) else "fits" if fit.get("fits") else "does not fit"
    return f"available ({verdict})"


def _follow(ctx: click.Context, job: JsonObject, detach: bool) -> JsonObject:
    """Show a job's progress until it ends; Ctrl-C cancels it. Returns the final job."""
    job_id = job["id"]
    if detach:
        click.echo(f"Job {job_id} ({job['kind']} {job['target']}) started; follow it with `appliancectl models job {job_id}`.")
        return job
    console = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
    try:
        with admin_client(ctx, timeout=None) as client, Progress(*columns, console=console, transient=False) as bar:  # type: ignore[arg-type]
            task = bar.add_task(f"{job['kind']} {job['target']}", total=job.get("total_bytes"))
            with client.stream("GET", f"/admin/jobs/{job_id}/events") as response:
                if response.status_code >= 400:
                    response.read()
                    check(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    label = f"{job['kind']} {job['target']}" + (f" ({event['message']})" if event.get("message") else "")
                    bar.update(task, completed=event.get("done_bytes") or 0, total=event.get("total_bytes"), description=label)
            final = check(client.get(f"/admin/jobs/{job_id}"))
    except KeyboardInterrupt:
        request(ctx, "POST", f"/admin/jobs/{job_id}/cancel")
        raise click.ClickException(
            f"cancelled job {job_id}; a cancelled pull resumes when you pull the same name again"
        ) from None
    except httpx.TransportError as exc:
        raise click.ClickException(f"cannot reach the appliance: {exc}") from None
    if final["state"] != "done":
        raise click.ClickException(f"{final['kind']} {final['target']} {final['state']}: {final.get('message') or 'no details'}")
    return final


def _done(final: JsonObject, verb: str) -> None:
    result = final.get("result") or {}
    if final["state"] == "done" and result:
        click.echo(f"{verb} {result['name']}: {result['status']}, {_size(result['size_bytes'])}, sha256 {result['sha256']}")


def register(group: click.Group) -> None:
    models = subgroup(group, "models", "Manage models.")

    @models.command("ls")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_context
    def ls(ctx: click.Context, as_json: bool) -> None:
        """List model variants: installed ones, and those available on the hub (with the planner's fit), not downloaded."""
        rows = request(ctx, "GET", "/admin/models/")
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        table = Table("model", "default", "status", "format", "quantization", "size", "from")
        for r in rows:
            table.add_row(
                r["name"],
                "*" if r["is_default"] else "",
                _status(r),
                r["format"],
                r["quantization"] or "-",
                _size(r["size_bytes"]),
                r["parent"] or r["source"] or "",
            )
        Console().print(table)

    @models.command("pull")
    @click.argument("url_or_name")
    @click.option("--sha256", help="Expected sha256 of the file (catalog entries carry their own when published).")
    @click.option("--name", help="Install as family:variant (default: from the catalog or the file name).")
    @click.option("--detach", is_flag=True, help="Start the job and return.")
    @click.pass_context
    def pull(ctx: click.Context, url_or_name: str, sha256: str | None, name: str | None, detach: bool) -> None:
        """Download a GGUF file by URL, a hub model (hf:ORG/REPO[:QUANT|/FILE][@REVISION]) or a catalog variant by
        name (family:variant). Resumes an interrupted pull."""
        is_url = "://" in url_or_name or url_or_name.startswith("hf:")
        body = {"url": url_or_name if is_url else None, "sha256": sha256, "name": name if is_url else (name or url_or_name)}
        job = request(ctx, "POST", "/admin/models/pull", json=body)
        hub = job.get("hub")
        if hub:
            click.echo(
                f"{hub['name']} from {hub['source']}: {_size(hub['size_bytes'])} in {hub['files']} file(s); {hub['reason']}"
            )
        _done(_follow(ctx, job, detach), "Pulled")

    @models.command("import")
    @click.argument("path", type=click.Path(exists=False))
    @click.option("--name", help="Install as family:variant (default: from the file or folder name).")
    @click.option("--detach", is_flag=True, help="Start the job and return.")
    @click.pass_context
    def import_(ctx: click.Context, path: str, name: str | None, detach: bool) -> None:
        """Copy a GGUF file, a Hugging Face safetensors folder or an offline bundle (`models export`), on the
        appliance's machine, into the store."""
        job = request(ctx, "POST", "/admin/models/import", json={"path": str(Path(path).absolute()), "name": name})
        _done(_follow(ctx, job, detach), "Imported")

    @models.command("export")
    @click.argument("name")
    @click.argument("file", type=click.Path(dir_okay=False))
    @click.pass_context
    def export(ctx: click.Context, name: str, file: str) -> None:
        """Write an offline bundle of NAME to FILE: a tar of its files and a manifest with their sizes and sha256.
        `models import FILE` installs it on another appliance, with no network."""
        target = Path(file)
        if target.exists():
            raise click.ClickException(f"{file} exists; choose a new file name")
        partial = target.with_name(target.name + ".partial")
        try:
            with admin_client(ctx, timeout=None) as client, client.stream("GET", f"/admin/models/{name}/bundle") as response:  # type: ignore[arg-type]
                if response.status_code >= 400:
                    response.read()
                    check(response)
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise click.ClickException(f"the export was interrupted: {exc}") from None
        os.replace(partial, target)
        click.echo(f"Exported {name} to {file} ({_size(target.stat().st_size)}).")

    @models.command("scan")
    @click.option("--detach", is_flag=True, help="Start the job and return.")
    @click.pass_context
    def scan(ctx: click.Context, detach: bool) -> None:
        """Read-only store: register the models now in its folder and forget those gone."""
        final = _follow(ctx, request(ctx, "POST", "/admin/models/scan"), detach)
        result = final.get("result") or {}
        if final["state"] == "done":
            registered = result.get("registered") or []
            click.echo(
                f"Registered {len(registered)} new or changed model(s)" + (f": {', '.join(registered)}" if registered else ".")
            )

    @models.command("rm")
    @click.argument("name")
    @click.option("--yes", is_flag=True, help="Do not ask.")
    @click.pass_context
    def rm(ctx: click.Context, name: str, yes: bool) -> None:
        """Delete an installed variant (family:variant). Refused while it is loaded."""
        if not yes:
            click.confirm(f"Delete {name} and its files?", abort=True)
        request(ctx, "DELETE", f"/admin/models/{name}")
        click.echo(f"Deleted {name}.")

    @models.command("verify")
    @click.argument("name")
    @click.option("--detach", is_flag=True, help="Start the job and return.")
    @click.pass_context
    def verify(ctx: click.Context, name: str, detach: bool) -> None:
        """Hash a variant's files again; a mismatch marks it corrupt (never loaded)."""
        final = _follow(ctx, request(ctx, "POST", f"/admin/models/{name}/verify"), detach)
        result = final.get("result")
        if result:
            if result["status"] != "ready":
                raise click.ClickException(f"{result['name']} is CORRUPT: its files do not match the recorded sha256")
            click.echo(f"{result['name']} verified: sha256 {result['sha256']}")

    @models.command("inspect")
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_context
    def inspect(ctx: click.Context, name: str, as_json: bool) -> None:
        """Show a variant's architecture facts, files and provenance."""
        info = request(ctx, "GET", f"/admin/models/{name}")
        if as_json:
            click.echo(json.dumps(info, indent=2))
            return
        facts = info["facts"]
        table = Table(show_header=False)
        for key, value in (
            ("name", info["name"]),
            ("status", info["status"]),
            ("format", info["format"]),
            ("quantization", info["quantization"]),
            ("size", _size(info["size_bytes"])),
            ("sha256", info["sha256"]),
            ("source", info["source"]),
            ("parent", info["parent"]),
            ("default", info["is_default"]),
        ):
            table.add_row(key, str(value))
        for key in (
            "architecture",
            "n_layer",
            "n_embd",
            "n_head",
            "n_head_kv",
            "head_dim",
            "context_length",
            "sliding_window",
            "n_vocab",
            "n_expert",
            "parameter_count",
        ):
            if facts.get(key) is not None:
                table.add_row(key, str(facts[key]))
        table.add_row("chat template", "yes (rendered only in the sandbox)" if facts.get("has_chat_template") else "no")
        if facts.get("chat_template_flags"):
            table.add_row("template warnings", ", ".join(facts["chat_template_flags"]))
        Console().print(table)

    @models.command("quantize")
    @click.argument("name")
    @click.option("--to", "to", required=True, help="Target quantization, e.g. q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k.")
    @click.option("--detach", is_flag=True, help="Start the job and return.")
    @click.pass_context
    def quantize(ctx: click.Context, name: str, to: str, detach: bool) -> None:
        """Make a lower-bit GGUF variant of NAME (from F32/F16/BF16/Q8_0) with libllama's quantizer."""
        job = request(ctx, "POST", f"/admin/models/{name}/quantize", json={"to": to})
        _done(_follow(ctx, job, detach), "Made")

    @models.command("default")
    @click.argument("name")
    @click.pass_context
    def default(ctx: click.Context, name: str) -> None:
        """Make family:variant its family's default variant."""
        info = request(ctx, "POST", f"/admin/models/{name}/default")
        click.echo(f"{info['family']} now means {info['name']}.")

    @models.command("job")
    @click.argument("job_id", type=int)
    @click.pass_context
    def job(ctx: click.Context, job_id: int) -> None:
        """Follow a store job (pull, import, verify, quantize) until it ends."""
        _follow(ctx, request(ctx, "GET", f"/admin/jobs/{job_id}"), False)

    @models.command("cancel")
    @click.argument("job_id", type=int)
    @click.pass_context
    def cancel(ctx: click.Context, job_id: int) -> None:
        """Cancel a running store job (a cancelled pull keeps its partial file and resumes later)."""
        info = request(ctx, "POST", f"/admin/jobs/{job_id}/cancel")
        click.echo(f"Job {job_id}: {info['state']}.")
