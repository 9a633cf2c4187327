"""`appliancectl doctor` and `appliancectl plan MODEL`: what this box has, and what fits on it.

``doctor`` inspects the local box (or, with ``--url``, asks the remote daemon).
``plan`` takes a path to a GGUF file or Hugging Face folder (inspected locally),
or a model name: the running daemon answers for installed and catalog models,
and without a daemon the catalog is planned against the local hardware.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from appliance.hardware.units import GiB
from appliance.jsontypes import JsonObject


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.0f} MiB"


def _memory_cell(memory: list[JsonObject]) -> str:
    lines = []
    for m in memory:
        used = m["weights"] + m["kv_cache"] + m["compute"] + m["overhead"]
        lines.append(
            f"{m['device']}: {m['weights'] / GiB:.2f} W + {m['kv_cache'] / GiB:.2f} KV + {m['compute'] / GiB:.2f} C"
            f" + {m['overhead'] / GiB:.2f} O = {_gib(used)} of {_gib(m['free'])} free"
        )
    return "\n".join(lines) or "-"


def _engine_line(sw: JsonObject) -> str:
    """``llama-cpp-python 0.3.36, cuda build, GPU offload yes``."""
    if not sw["llamacpp_version"]:
        return "not installed"
    backends = ", ".join(sw["llamacpp_gpu_backends"]) or "CPU only"
    flavour = f"{sw['llamacpp_flavour']} build" if sw.get("llamacpp_flavour") else f"backends: {backends}"
    offload = sw.get("llamacpp_gpu_offload")
    said = "unknown (the library did not load)" if offload is None else ("yes" if offload else "no")
    return f"llama-cpp-python {sw['llamacpp_version']}, {flavour}, GPU offload {said}"


def _print_doctor(report: JsonObject) -> None:
    hw, sw = report["hardware"], report["software"]
    cpu = hw["cpu"]
    flags = set(cpu["flags"])
    yes = lambda f: "yes" if f else "no"  # noqa: E731
    click.echo(
        f"CPU:   {cpu['model']}: {cpu['physical_cores']} cores / {cpu['threads']} threads, {cpu['arch']}, "
        f"{cpu['numa_nodes']} NUMA node(s)"
    )
    click.echo(
        f"       AVX2 {yes('avx2' in flags)}, AVX-512 {yes('avx512f' in flags)}, AMX {yes('amx_tile' in flags)}; "
        f"flags: {' '.join(cpu['flags']) or '-'}"
    )
    click.echo(f"RAM:   {_gib(cpu['memory_total'])} total, {_gib(cpu['memory_available'])} available")
    if not hw["gpus"]:
        click.echo("GPU:   none usable (CPU only)")
    for g in hw["gpus"]:
        extra = f", compute capability {g['compute_capability']}" if g.get("compute_capability") else ""
        mig = ", MIG instance" if g.get("mig_instance") else (", MIG enabled" if g.get("mig_enabled") else "")
        click.echo(
            f"GPU{g['index']}:  {g['name']} ({g['vendor']}): {_gib(g['memory_free'])} free of "
            f"{_gib(g['memory_total'])}{extra}{mig}"
        )
    if hw.get("nvidia_driver"):
        click.echo(f"NVIDIA driver {hw['nvidia_driver']}, CUDA {hw.get('cuda_version') or '?'}")
    if hw.get("rocm_version"):
        click.echo(f"ROCm {hw['rocm_version']}")
    click.echo(f"llama.cpp: {_engine_line(sw)}")
    click.echo(f"vLLM:  {('installed ' + (sw.get('vllm_version') or '')).strip() if sw['vllm_available'] else 'not installed'}")
    if report["findings"]:
        click.echo("Findings:")
    for f in report["findings"]:
        click.echo(f"  {f['severity']:<7} {f['component']}: {f['message']}")
        if f.get("fix"):
            click.echo(f"          fix: {f['fix']}")


def _speed_cell(row: JsonObject) -> str:
    """``12 tok/s\n400 prompt`` (estimated decode per stream and prompt tokens/s), or ``-``."""
    if row.get("decode_tps") is None:
        return "-"
    decode, prompt = row["decode_tps"], row.get("prompt_tps") or 0
    return f"{decode:.1f} tok/s\n{prompt:.0f} prompt" if decode < 10 else f"{decode:.0f} tok/s\n{prompt:.0f} prompt"


def _print_plan(report: JsonObject) -> None:
    table = Table(
        "variant",
        "format",
        "quant",
        "size",
        "fits",
        "backend",
        "placement",
        "estimate",
        "memory",
        "speed",
        "why",
        title=f"{report['model']}: context {report['context']}, {report['parallel']} parallel",
    )
    for r in report["rows"]:
        fits = ("[bold green]chosen[/]" if r["chosen"] else "yes") if r["fits"] else "[red]no[/]"
        est = _gib(r["estimated_bytes"]) if r["estimated_bytes"] else "-"
        table.add_row(
            r["variant"],
            r["format"],
            r["quantization"] or "-",
            _gib(r["size_bytes"]),
            fits,
            r["backend"] or "-",
            r["placement"],
            est,
            _memory_cell(r["memory"]),
            _speed_cell(r),
            r["reason"],
        )
    console = Console()
    console.print(table)
    if report["plan"]:
        p = report["plan"]
        console.print(f"Plan: {p['model']} on {p['backend']}: {p['reason']}", highlight=False)
        if report.get("min_decode_tps"):
            console.print(
                f"Speeds are estimates per stream at {report['parallel']} streams; the floor is "
                f"{report['min_decode_tps']:g} tok/s (min_decode_tokens_per_s).",
                highlight=False,
            )
    else:
        refusal = report["refusal"]
        console.print(f"[red]Does not fit:[/] {refusal['reason']}", highlight=False)
        for line in refusal["needed"]:
            console.print(f"  needs {line}", highlight=False)


def _local_plan(ctx: click.Context, model: str, context: int | None, parallel: int | None) -> JsonObject:
    from appliance.errors import ApplianceError
    from appliance.planner.service import (
        live_snapshot,
        plan_report,
        preferences_for,
        resolve_variants,
        software,
        variants_from_path,
    )

    settings = ctx.find_root().obj["settings"]
    try:
        path = Path(model)
        variants = variants_from_path(path) if path.exists() else resolve_variants(model)
        prefs = preferences_for(settings, software(settings), context, parallel)
        return plan_report(live_snapshot(), variants, prefs)
    except ApplianceError as exc:
        raise click.ClickException(exc.message) from None


def register(group: click.Group) -> None:
    @group.command("doctor")
    @click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
    @click.pass_context
    def doctor(ctx: click.Context, as_json: bool) -> None:
        """Report the hardware and inference software, what is missing with its fix, and the HTTPS certificate.

        Exits 1 when a finding is an error (hardware present that cannot be used).
        """
        obj = ctx.find_root().obj or {}
        if obj.get("url"):
            from appliance.cli.client import request

            report = request(ctx, "GET", "/admin/hardware")
        else:
            from appliance.planner.service import hardware_report

            report = hardware_report(obj["settings"])
        from appliance.cli.tls import certificate_lines, certificate_report

        report["tls"] = certificate_report(obj["settings"], obj.get("url"))
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            _print_doctor(report)
            click.echo("\n".join(certificate_lines(report["tls"])))
        if not report["ok"]:
            ctx.exit(1)

    @group.command("plan")
    @click.argument("model")
    @click.option("--ctx", "context", type=click.IntRange(1, 1 << 22), help="Context tokens (default: engine_context).")
    @click.option("--parallel", type=click.IntRange(1, 4096), help="Parallel sequences (default: engine_parallel).")
    @click.option("--json", "as_json", is_flag=True, help="Print the plan table as JSON.")
    @click.pass_context
    def plan_cmd(ctx: click.Context, model: str, context: int | None, parallel: int | None, as_json: bool) -> None:
        """Show how every variant of MODEL would fit on this box, and which one the planner picks.

        MODEL is a GGUF file, a Hugging Face folder, or a model name (family or family:variant).
        """
        obj = ctx.find_root().obj or {}
        settings = obj.get("settings")
        daemon = obj.get("url") or (settings is not None and settings.admin_socket.exists())
        if Path(model).exists() or not daemon:
            report = _local_plan(ctx, model, context, parallel)
        else:
            from appliance.cli.client import request

            params = {k: v for k, v in (("model", model), ("ctx", context), ("parallel", parallel)) if v is not None}
            report = request(ctx, "GET", "/admin/plan", params=params)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            _print_plan(report)
        if report["plan"] is None:
            ctx.exit(2)
