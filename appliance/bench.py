"""A load generator for any OpenAI-compatible endpoint: N concurrent streaming clients.

Each client sends requests back to back (streaming, greedy by default) and
records time to first token, tokens received and duration. Tokens are counted
from the server's usage chunk when it sends one, else from content events.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some facts about the planet Mars.",
    "Describe the water cycle for a child.",
    "What makes bread rise when it bakes?",
    "Tell me about the history of the printing press.",
    "Describe a walk through a busy market.",
    "How do bees make honey?",
    "Write a letter to a friend about a trip to the sea.",
    "Explain why the sky is blue.",
    "Describe how a train works.",
    "Tell a story about a cat who learns to swim.",
    "What is a volcano and why does it erupt?",
    "Describe the four seasons.",
    "Explain how to plant a tree.",
    "Write about a day in the life of a farmer.",
]


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float | None
    duration_s: float
    tokens: int
    status: int
    error: str | None = None


@dataclass
class BenchResult:
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    total_tokens: int
    aggregate_tps: float
    per_stream_tps_median: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def one_request(
    client: httpx.AsyncClient, endpoint: str, model: str, prompt: str, max_tokens: int, temperature: float
) -> RequestResult:
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/completions"
    started = time.perf_counter()
    ttft = None
    events = 0
    usage_tokens = None
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                return RequestResult(False, None, time.perf_counter() - started, 0, response.status_code, text)
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") if endpoint != "chat" else (choice.get("delta") or {}).get("content")
                    if piece:
                        events += 1
                        if ttft is None:
                            ttft = time.perf_counter() - started
    except httpx.HTTPError as exc:
        return RequestResult(False, ttft, time.perf_counter() - started, events, 0, f"{type(exc).__name__}: {exc}")
    return RequestResult(True, ttft, time.perf_counter() - started, usage_tokens if usage_tokens is not None else events, 200)


async def run_bench(
    base_url: str,
    *,
    api_key: str | None,
    model: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    endpoint: str = "completions",
    temperature: float = 0.0,
    timeout: float = 600.0,
) -> BenchResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[RequestResult] = []
    counter = iter(range(requests))

    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            for index in counter:
                prompt = PROMPTS[index % len(PROMPTS)]
                results.append(await one_request(client, endpoint, model, prompt, max_tokens, temperature))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started

    good = [r for r in results if r.ok]
    total_tokens = sum(r.tokens for r in good)
    per_stream = [r.tokens / max(r.duration_s - (r.ttft_s or 0), 1e-6) for r in good if r.tokens > 1]
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    return BenchResult(
        concurrency=concurrency,
        requests=len(results),
        failed=len(results) - len(good),
        wall_s=round(wall, 3),
        total_tokens=total_tokens,
        aggregate_tps=round(total_tokens / wall, 2) if wall else 0.0,
        per_stream_tps_median=round(statistics.median(per_stream), 2) if per_stream else 0.0,
        ttft_p50_s=_round(percentile(ttfts, 50)),
        ttft_p95_s=_round(percentile(ttfts, 95)),
        errors=sorted({r.error for r in results if r.error})[:5],
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
