"""Mixed traffic at 50%, 70% and 90% of the box's capacity: the appliance and llama-server, interleaved.

Requests arrive at random (Poisson) with prompts from a spread (short chats to
documents of about 1,000 tokens) and 16-256 new tokens each (streaming
``/v1/completions``, greedy, ``ignore_eos``). Both servers are loaded at once (the
appliance's daemon, or its worker alone with ``--target worker``, and llama-server
``-np 8`` built by ``compare_servers.build_llama_server``), 2 threads and 8 slots of
2,048 tokens each. First the capacity: requests per second with 8 in flight at a
time, on each server, the larger one counting. Then, for each load and round, the
same arrival schedule (its own seed per round) runs on each server in turn.

Printed per load, medians over the rounds: tokens/s, TTFT p50/p95/p99, TPOT
p50/p95 (per request: the time after the first token over the tokens after it),
goodput (the share of requests with TTFT <= 2 s and TPOT <= 150 ms, answered in
full), the requests shed with 429/503 and those that passed the deadline
unanswered, and the appliance / llama-server ratios.

    python tests/bench/bench_mixed_traffic.py [--rounds 3] [--requests 24] [--target daemon|worker] [--dump FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.compare_interleaved import Refused, Target, one, start_worker  # noqa: E402
from tests.bench.compare_servers import (  # noqa: E402
    build_llama_server,
    free_port,
    fresh_model_copy,
    start_comparison_daemon,
    start_llama_server_np8,
    stop_process,
)

LOADS = (0.5, 0.7, 0.9)
TTFT_GOAL_S, TPOT_GOAL_S = 2.0, 0.150
#: A request unanswered after this long counts as past its deadline.
DEADLINE_S = 120.0
WORDS = [
    *("river", "market", "engine", "garden", "winter", "signal", "copper", "forest", "harbor", "lantern"),
    *("meadow", "orbit", "pencil", "quartz", "ribbon", "saddle", "thunder", "velvet", "whistle", "yellow"),
    *("anchor", "basket", "candle", "dragon", "ember", "falcon", "glacier", "hammer", "island", "jungle"),
]


def prompt_of(rng: random.Random, i: int) -> str:
    """A prompt from the spread: 60% chats (5-60 words), 30% notes (100-400), 10% documents (900-1,100, about as many tokens)."""
    kind = rng.random()
    words = rng.randint(5, 60) if kind < 0.6 else rng.randint(100, 400) if kind < 0.9 else rng.randint(900, 1100)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Request {i} ({rng.getrandbits(32):08x}). Summarise: {body}"  # a distinct head: no prefix cache shortcut


def workload(seed: int, n: int, rate: float) -> list[tuple[float, str, int]]:
    """``n`` requests (arrival second, prompt, new tokens) arriving as a Poisson process of ``rate`` per second."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        out.append((t, prompt_of(rng, i), rng.randint(16, 256)))
        t += rng.expovariate(rate)
    return out


async def timed(target: Target, prompt: str, max_tokens: int) -> dict[str, float | str]:
    try:
        events, first, total = await asyncio.wait_for(one(target, prompt, max_tokens), DEADLINE_S)
    except TimeoutError:
        return {"outcome": "deadline"}
    except Refused as exc:
        return {"outcome": f"shed {exc.status}"}
    tpot = (total - first) / max(1, events - 1)
    return {"outcome": "ok", "tokens": events, "ttft": first, "tpot": tpot, "total": total, "prompt_chars": len(prompt)}


async def play(target: Target, schedule: list[tuple[float, str, int]]) -> tuple[list[dict[str, float | str]], float]:
    start = time.perf_counter()

    async def at(offset: float, prompt: str, max_tokens: int) -> dict[str, float | str]:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        return {"arrival": offset, "max_tokens": max_tokens, **(await timed(target, prompt, max_tokens))}

    results = await asyncio.gather(*(at(*r) for r in schedule))
    return list(results), time.perf_counter() - start


async def capacity(target: Target, schedule: list[tuple[float, str, int]], in_flight: int = 8) -> float:
    """Requests per second with ``in_flight`` requests at a time (arrival times ignored)."""
    queue = list(schedule)
    start = time.perf_counter()

    async def lane() -> None:
        while queue:
            _, prompt, max_tokens = queue.pop()
            await timed(target, prompt, max_tokens)

    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return len(schedule) / (time.perf_counter() - start)


def wait_ready(target: Target, timeout: float = 600.0) -> None:
    """Until ``target`` answers a short completion (a worker answers 503 while its model loads)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            asyncio.run(one(target, "Hello", 4))
            return
        except (Refused, RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(results: list[dict[str, float | str]], wall: float) -> dict[str, float]:
    ok = [r for r in results if r["outcome"] == "ok"]
    ttft, tpot = [float(r["ttft"]) for r in ok], [float(r["tpot"]) for r in ok]
    good = sum(1 for r in ok if float(r["ttft"]) <= TTFT_GOAL_S and float(r["tpot"]) <= TPOT_GOAL_S)
    return {
        "tok_s": sum(float(r["tokens"]) for r in ok) / wall,
        "ttft_p50": pct(ttft, 50),
        "ttft_p95": pct(ttft, 95),
        "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50),
        "tpot_p95": pct(tpot, 95),
        "goodput": good / len(results),
        "shed": sum(1 for r in results if str(r["outcome"]).startswith("shed")),
        "deadline": sum(1 for r in results if r["outcome"] == "deadline"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24, help="requests per load and round")
    parser.add_argument("--capacity-requests", type=int, default=16)
    parser.add_argument("--target", choices=("daemon", "worker"), default="daemon")
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    parser.add_argument("--dump", type=Path, help="write every request's figures here, one JSON line each")
    args = parser.parse_args()
    binary = args.llama_server or build_llama_server()
    runs: dict[float, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(fresh_model_copy(Path(tmp)))
        port = free_port()
        server = daemon = worker = None
        try:
            server = start_llama_server_np8(binary, model, port)
            if args.target == "daemon":
                daemon = start_comparison_daemon(Path(tmp))
                daemon_port = daemon.port
                ours = Target("appliance", port=daemon_port, model="default", key=daemon.create_key("bench"))
            else:
                socket = os.path.join(tmp, "worker.sock")
                worker = start_worker(model, socket)
                while not os.path.exists(socket):
                    time.sleep(0.2)
                ours = Target("appliance worker", socket=socket)
            targets = [ours, Target("llama-server", port=port)]
            for t in targets:  # loads the model on demand, warms up
                wait_ready(t)
                asyncio.run(play(t, workload(99, 2, 10.0)))
            probe = workload(7, args.capacity_requests, 1.0)
            caps = {t.name: asyncio.run(capacity(t, probe)) for t in targets}
            cap = max(caps.values())
            print("capacity (requests/s, 8 in flight): " + ", ".join(f"{k} {v:.3f}" for k, v in caps.items()), flush=True)
            for load in args.loads:
                runs[load] = {t.name: [] for t in targets}
                for r in range(args.rounds):
                    schedule = workload(1000 * r + int(load * 100), args.requests, load * cap)
                    order = targets if r % 2 == 0 else targets[::-1]
                    for t in order:
                        results, wall = asyncio.run(play(t, schedule))
                        runs[load][t.name].append(summary(results, wall))
                        if args.dump is not None:
                            with args.dump.open("a") as out:
                                for i, one_result in enumerate(results):
                                    row = {"server": t.name, "load": load, "round": r, "request": i, **one_result}
                                    out.write(json.dumps(row) + "\n")
                    print(f"load {load:.0%} round {r + 1}/{args.rounds} done", flush=True)
        finally:
            if daemon is not None:
                daemon.stop()
            if server is not None:
                stop_process(server)
            if worker is not None:
                worker.terminate()
                worker.wait()

    names = [t.name for t in targets]
    fields = ("tok_s", "ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "goodput", "shed", "deadline")

    def med(load: float, name: str, field: str) -> float:
        return statistics.median(run[field] for run in runs[load][name])

    print(f"\n{args.rounds} interleaved rounds of {args.requests} Poisson arrivals per load, medians; capacity {cap:.3f} req/s\n")
    print("| load | server | tok/s | TTFT p50 | TTFT p95 | TTFT p99 | TPOT p50 | TPOT p95 | goodput | shed | past deadline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for load in args.loads:
        for name in names:
            v = {f: med(load, name, f) for f in fields}
            print(
                f"| {load:.0%} | {name} | {v['tok_s']:.1f} | {v['ttft_p50']:.2f} s | {v['ttft_p95']:.2f} s "
                f"| {v['ttft_p99']:.2f} s "
                f"| {v['tpot_p50'] * 1000:.0f} ms | {v['tpot_p95'] * 1000:.0f} ms | {v['goodput']:.2f} | {v['shed']:.0f} "
                f"| {v['deadline']:.0f} |"
            )
    print()
    for load in args.loads:
        a, b = names
        print(
            f"{load:.0%}: {a} / {b}: tokens/s {med(load, a, 'tok_s') / med(load, b, 'tok_s'):.2f}x, "
            f"TTFT p95 {med(load, a, 'ttft_p95') / med(load, b, 'ttft_p95'):.2f}x, "
            f"goodput {med(load, a, 'goodput'):.2f} vs {med(load, b, 'goodput'):.2f}"
        )


if __name__ == "__main__":
    main()
