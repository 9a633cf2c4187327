"""Prompt-lookup speculative decoding on and off, on repetitive output and on prose.

    python -m tests.bench.bench_speculative [--rounds 3] [--tokens 192] [--streams 1 2]
        [--workloads prose json ...] [--ngram N] [--show-samples]

Starts two llama.cpp workers on one fresh copy of the default model (Gemma 3 270M
Q4_K_M; 2 threads, 8 slots of 1,024 tokens, as ``bench_worker.py`` starts them): one
plain, one with ``--spec-ngram`` of the size the daemon passes when
``speculative_ngram`` is on (``drivers/llamacpp/driver.py``; ``--ngram`` tries
another). Five workloads, two prompts each, completion-style so that even this
small base model really copies where the output is meant to repeat:

- ``prose``: open-ended writing (``bench_worker.PROMPTS``), greedy: this small model
  soon repeats its own sentences;
- ``prose sampled``: the same at temperature 1.0 (the API's default; seeded), where
  most drafts fail;
- ``json``: a 30-line JSON object, then the start of its copy with one field changed;
- ``code``: a 40-line Python function, then the start of its copy with ``x`` renamed;
- ``quote``: a paragraph, then the start of its verbatim quotation.

Each round runs every workload at 1 stream (the two prompts one after the other) and
at 2 concurrent streams, on both workers, the worker that goes first alternating
from round to round so the box's drift hits both alike. Streaming
``/v1/completions``, greedy but for ``prose sampled``, end of generation banned so
every request makes exactly ``--tokens`` tokens. Per request: end-to-end seconds and
the decode rate (tokens after the first over the time after the first, so without
the TTFT). Prints a markdown table of medians over rounds, the acceptance of the
drafting worker's drafts (its ``/stats`` deltas), whether the two workers' texts
were the same in each round (and from which character they part where not), and
whether the plain worker's own texts were the same every round; ``--show-samples``
prints the start of each prompt's output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from appliance.drivers.llamacpp.driver import SPEC_NGRAM  # noqa: E402  # the n-gram size the daemon passes
from tests.bench.bench_worker import EOG, PROMPTS, sse_events, start_worker  # noqa: E402
from tests.bench.compare_servers import fresh_model_copy  # noqa: E402


def _service_config(name: str, port: int, region: str) -> dict:
    return {
        "name": name,
        "version": "2.4.1",
        "region": region,
        "port": port,
        "debug": False,
        "workers": 4,
        "timeout_seconds": 30,
        "database": {"host": "db.internal", "port": 5432, "name": f"{name}_prod", "pool_size": 10, "ssl": True},
        "cache": {"enabled": True, "ttl_seconds": 300, "max_entries": 10000},
        "features": ["search", "export", "audit_log", "webhooks"],
        "owners": [
            {"team": "platform", "email": "platform@example.com"},
            {"team": "billing", "email": "billing@example.com"},
        ],
        "limits": {"requests_per_minute": 600, "burst": 50, "max_body_kb": 512},
    }


def _json_prompt(config: dict, field_name: str, new_value: object) -> str:
    text = json.dumps(config, indent=2)
    return (
        f"Here is a service configuration:\n\n{text}\n\n"
        f'Here is the same configuration, unchanged except that "{field_name}" is now {json.dumps(new_value)}:\n\n{{\n'
    )


_CODE_A = '''def summarize_orders(orders, min_total=0.0):
    """Group orders by customer and return totals, counts and the largest order."""
    x = 0
    totals = {}
    counts = {}
    largest = {}
    skipped = []
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            skipped.append(order)
            continue
        amount = float(order.get("amount", 0.0))
        if amount < min_total:
            skipped.append(order)
            continue
        x += 1
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
        if amount > largest.get(customer, 0.0):
            largest[customer] = amount
    report = []
    for customer in sorted(totals):
        average = totals[customer] / counts[customer]
        report.append(
            {
                "customer": customer,
                "total": round(totals[customer], 2),
                "orders": counts[customer],
                "average": round(average, 2),
                "largest": round(largest[customer], 2),
            }
        )
    return {
        "report": report,
        "processed": x,
        "skipped": len(skipped),
        "customers": len(report),
    }
'''

_CODE_B = '''def parse_log_lines(lines, level="INFO"):
    """Parse log lines into records, keeping those at or above ``level``."""
    order = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    threshold = order.index(level)
    x = 0
    records = []
    errors = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(" ", 3)
        if len(parts) < 4:
            errors.append(line)
            continue
        date, clock, name, message = parts
        name = name.strip("[]").upper()
        if name not in order:
            errors.append(line)
            continue
        if order.index(name) < threshold:
            continue
        x += 1
        records.append(
            {
                "when": f"{date} {clock}",
                "level": name,
                "message": message,
                "index": x,
            }
        )
    by_level = {}
    for record in records:
        by_level[record["level"]] = by_level.get(record["level"], 0) + 1
    return {
        "records": records,
        "kept": x,
        "errors": errors,
        "by_level": by_level,
    }
'''


def _code_prompt(code: str) -> str:
    head = code.split("\n", 1)[0]
    return (
        f"# The original function:\n\n{code}\n\n# The same function, rewritten with the variable x renamed to count:\n\n{head}\n"
    )


_QUOTE_A = (
    "The lighthouse at the end of the harbour was built in 1872 from granite quarried on the far side "
    "of the bay. For almost a century its keepers climbed one hundred and twelve steps every evening to "
    "light the lamp, trim the wick and wind the clockwork that turned the lens. In storms they stayed "
    "awake all night, wiping salt from the windows and writing in the log the name of every ship that "
    "passed. When the light was automated in 1968 the last keeper, Thomas Avery, handed over the keys, "
    "the log books and a brass telescope that had belonged to the first keeper's wife. The books are now "
    "kept in the town museum, where visitors can read the careful handwriting of men who watched the sea "
    "for a living, and the telescope still points at the harbour mouth from the museum's upper window."
)

_QUOTE_B = (
    "Bread needs only four things: flour, water, salt and time. Mix the flour and water and let them rest "
    "for half an hour, so the flour drinks the water and the gluten starts to form on its own. Then add "
    "the salt and the yeast and knead the dough until it is smooth and springs back when pressed with a "
    "finger. Leave it covered in a warm place until it has doubled in size, which can take one hour or "
    "three depending on the kitchen. Shape it gently, so as not to knock out all the air, and let it rise "
    "again while the oven heats as hot as it will go. Bake it until the crust is deep brown and the loaf "
    "sounds hollow when tapped underneath, and then, hardest of all, let it cool before cutting it."
)


def _quote_prompt(paragraph: str) -> str:
    opening = " ".join(paragraph.split(" ")[:6])  # the quotation begun, so that the base model goes on copying
    return f'{paragraph}\n\nQuote the paragraph above verbatim.\n\nQuotation:\n\n"{opening}'


#: workload -> two prompts (the two streams at 2 concurrent streams; one after the other at 1)
WORKLOADS: dict[str, list[str]] = {
    "prose": PROMPTS[:2],
    "prose sampled": PROMPTS[2:4],
    "json": [
        _json_prompt(_service_config("orders", 8080, "eu-west-1"), "port", 9090),
        _json_prompt(_service_config("invoices", 7000, "us-east-2"), "region", "ap-south-1"),
    ],
    "code": [_code_prompt(_CODE_A), _code_prompt(_CODE_B)],
    "quote": [_quote_prompt(_QUOTE_A), _quote_prompt(_QUOTE_B)],
}


@dataclass
class Request:
    """One streamed completion: its text, token count, TTFT and end-to-end seconds."""

    text: str
    tokens: int
    ttft: float
    seconds: float

    @property
    def decode_rate(self) -> float:
        """Tokens per second after the first token: the decode speed, without the prompt's reading."""
        return (self.tokens - 1) / max(1e-9, self.seconds - self.ttft)


@dataclass
class Cell:
    """One worker's figures for one workload at one concurrency, a list entry per round."""

    decode_rates: list[float] = field(default_factory=list)  # the mean of its requests' decode rates
    seconds: list[float] = field(default_factory=list)  # the mean of its requests' end-to-end seconds
    drafted: int = 0
    accepted: int = 0
    texts: list[list[str]] = field(default_factory=list)


#: Workloads sampled rather than greedy (temperature; each prompt's seed is its index): the API's
#: default temperature, where this small model's prose stops repeating itself and most drafts fail.
SAMPLED = {"prose sampled": 1.0}


async def complete(client: httpx.AsyncClient, prompt: str, tokens: int, temperature: float = 0.0, seed: int = 0) -> Request:
    """Stream one completion of exactly ``tokens`` tokens (greedy unless ``temperature``)."""
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": EOG,
    }
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    n = 0
    async with client.stream("POST", "http://worker/v1/completions", json=body) as r:
        r.raise_for_status()
        async for obj in sse_events(r):
            if obj.get("choices") and obj["choices"][0].get("text"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(obj["choices"][0]["text"])
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
    return Request("".join(parts), n, ttft or 0.0, time.perf_counter() - t0)


async def measure(sock: str, prompts: list[str], streams: int, tokens: int, temperature: float) -> tuple[list[Request], dict]:
    """Run ``prompts`` at ``streams`` concurrent requests; returns the requests and the /stats delta."""
    transport = httpx.AsyncHTTPTransport(uds=sock)
    async with httpx.AsyncClient(transport=transport, timeout=600) as client:
        before = (await client.get("http://worker/stats")).json()
        done: list[Request] = []
        for i in range(0, len(prompts), streams):
            batch = range(i, min(len(prompts), i + streams))
            done += await asyncio.gather(*(complete(client, prompts[k], tokens, temperature, seed=k) for k in batch))
        after = (await client.get("http://worker/stats")).json()
    return done, {k: after[k] - before[k] for k in ("spec_drafted_total", "spec_accepted_total")}


async def warm_up(sock: str) -> None:
    transport = httpx.AsyncHTTPTransport(uds=sock)
    async with httpx.AsyncClient(transport=transport, timeout=600) as client:
        await complete(client, "warm up", 8)


def engine_state(sock: str) -> str:
    """The worker's output-row padding and compute-thread changes (``/stats``): what can make one worker slower."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=10) as client:
        stats = client.get("http://worker/stats").json()
    keys = (
        "even_outputs",
        "even_outputs_padded_steps_total",
        "threads_current",
        "threads_trials_total",
        "threads_steps_down_total",
    )
    return ", ".join(f"{k} {stats[k]}" for k in keys)


def record(cell: Cell, requests: list[Request], delta: dict) -> None:
    cell.decode_rates.append(statistics.mean(r.decode_rate for r in requests))
    cell.seconds.append(statistics.mean(r.seconds for r in requests))
    cell.drafted += delta["spec_drafted_total"]
    cell.accepted += delta["spec_accepted_total"]
    cell.texts.append([r.text for r in requests])


def first_difference(a: list[str], b: list[str]) -> int:
    """The earliest character offset where two rounds' texts (request by request) part."""
    return min(_parting(p, q) for p, q in zip(a, b, strict=True) if p != q)


def _parting(p: str, q: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(p, q, strict=False)) if x != y), min(len(p), len(q)))


def identical(differ: list[int], rounds: int) -> str:
    if not differ:
        return "yes"
    return f"no: {len(differ)} of {rounds} rounds, from character {min(differ)}"


def table(cells: dict[tuple[str, int, str], Cell], workloads: dict[str, list[str]], streams: list[int]) -> str:
    """The markdown table: medians over rounds, off against on."""
    lines = [
        "| workload | streams | off tok/s | on tok/s | on / off | off e2e s | on e2e s | acceptance (accepted/drafted) "
        "| same text as off | off's text each round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        for s in streams:
            off, on = cells[(name, s, "off")], cells[(name, s, "on")]
            r_off, r_on = statistics.median(off.decode_rates), statistics.median(on.decode_rates)
            differ = [first_difference(a, b) for a, b in zip(off.texts, on.texts, strict=True) if a != b]
            acceptance = f"{on.accepted / on.drafted:.2f} ({on.accepted}/{on.drafted})" if on.drafted else "– (0/0)"
            lines.append(
                f"| {name} | {s} | {r_off:.1f} | {r_on:.1f} | **{r_on / r_off:.2f}×** | "
                f"{statistics.median(off.seconds):.2f} | {statistics.median(on.seconds):.2f} | {acceptance} | "
                f"{identical(differ, len(off.texts))} | {'same' if all(t == off.texts[0] for t in off.texts) else 'differs'} |"
            )
    return "\n".join(lines)


def samples(cells: dict[tuple[str, int, str], Cell], workloads: dict[str, list[str]]) -> None:
    for name, prompts in workloads.items():
        for i, text in enumerate(cells[(name, 1, "off")].texts[0]):
            print(f"--- {name} #{i}: prompt ends {prompts[i][-60:]!r}\n{text[:400]!r}\n", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ngram", type=int, default=SPEC_NGRAM, help="the drafting worker's --spec-ngram")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--show-samples", action="store_true", help="print the start of every prompt's output")
    args = ap.parse_args()
    workloads = {name: WORKLOADS[name] for name in args.workloads}
    cells = {(n, s, kind): Cell() for n in workloads for s in args.streams for kind in ("off", "on")}
    with tempfile.TemporaryDirectory() as d:
        model = fresh_model_copy(Path(d))
        socks = {"off": os.path.join(d, "off.sock"), "on": os.path.join(d, "on.sock")}
        procs = []
        try:
            for kind, extra in (("off", []), ("on", ["--spec-ngram", str(args.ngram)])):
                procs.append(start_worker(model, socks[kind], args.threads, 8, extra))
                asyncio.run(warm_up(socks[kind]))
            for r in range(args.rounds):
                order = ("off", "on") if r % 2 == 0 else ("on", "off")
                for name, prompts in workloads.items():
                    for s in args.streams:
                        for kind in order:
                            temperature = SAMPLED.get(name, 0.0)
                            requests, delta = asyncio.run(measure(socks[kind], prompts, s, args.tokens, temperature))
                            record(cells[(name, s, kind)], requests, delta)
                print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
            for kind, sock in socks.items():
                print(f"{kind} worker: {engine_state(sock)}", flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    if args.show_samples:
        samples(cells, workloads)
    print(table(cells, workloads, args.streams), flush=True)


if __name__ == "__main__":
    main()
