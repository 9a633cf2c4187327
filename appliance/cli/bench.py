"""`appliancectl bench`: concurrent streaming clients against any OpenAI endpoint."""

from __future__ import annotations

import asyncio
import json

import click


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--url", "base_url", default="http://127.0.0.1:8080/v1", show_default=True, help="OpenAI base URL (…/v1).")
    @click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key (or OPENAI_API_KEY).")
    @click.option("--model", default="default", show_default=True)
    @click.option(
        "-c",
        "--concurrency",
        "concurrency",
        multiple=True,
        type=int,
        default=(1, 8),
        show_default=True,
        help="Concurrent streams; repeat for several runs.",
    )
    @click.option("-n", "--requests", type=int, default=None, help="Requests per run (default: 2 × concurrency, at least 4).")
    @click.option("--max-tokens", type=int, default=128, show_default=True)
    @click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
    @click.option("--temperature", type=float, default=0.0, show_default=True)
    @click.option("--warmup/--no-warmup", default=True, show_default=True, help="One short request first (loads the model).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object per run.")
    def bench(
        base_url: str,
        api_key: str | None,
        model: str,
        concurrency: tuple[int, ...],
        requests: int | None,
        max_tokens: int,
        endpoint: str,
        temperature: float,
        warmup: bool,
        as_json: bool,
    ) -> None:
        """Measure aggregate tokens/s, per-stream tokens/s and TTFT p50/p95."""
        from appliance.bench import run_bench

        if warmup:
            asyncio.run(
                run_bench(
                    base_url,
                    api_key=api_key,
                    model=model,
                    concurrency=1,
                    requests=1,
                    max_tokens=2,
                    endpoint=endpoint,
                    temperature=temperature,
                )
            )
        if not as_json:
            click.echo(
                f"{'streams':>7} {'reqs':>5} {'fail':>4} {'agg tok/s':>10} {'per-stream':>10} {'TTFT p50':>9} {'TTFT p95':>9}"
            )
        for c in concurrency:
            n = requests or max(4, 2 * c)
            result = asyncio.run(
                run_bench(
                    base_url,
                    api_key=api_key,
                    model=model,
                    concurrency=c,
                    requests=n,
                    max_tokens=max_tokens,
                    endpoint=endpoint,
                    temperature=temperature,
                )
            )
            if as_json:
                click.echo(json.dumps(result.as_dict()))
                continue
            p50 = f"{result.ttft_p50_s:.3f}s" if result.ttft_p50_s is not None else "-"
            p95 = f"{result.ttft_p95_s:.3f}s" if result.ttft_p95_s is not None else "-"
            click.echo(
                f"{c:>7} {result.requests:>5} {result.failed:>4} {result.aggregate_tps:>10.1f} "
                f"{result.per_stream_tps_median:>10.1f} {p50:>9} {p95:>9}"
            )
            for error in result.errors:
                click.echo(f"        error: {error}")
