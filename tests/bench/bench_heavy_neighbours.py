"""Latency of a light 4-token chat beside each heavy request, on a quiet box and beside one busy process.

Starts a real daemon on the default model, then for each heavy case (a
5,000-string enum schema, a 256-value enum schema, 512 embedding inputs, a
10 MB prompt, a 1,800-token prompt, a schema whose string needs 200,000,000
characters, a 3,000-alternative ``pattern``) runs a few rounds of: heavy
request in flight, one light chat timed. Prints the light chat's median latency
beside each case, and alone.

With ``--hog`` every measurement is taken twice, the second time with one
``python -c "while True: pass"`` running (started before the condition, killed
after it), and the table shows both. After each start of the busy process a few
untimed light chats (``--settle``) let the engine measure its threads against the
new neighbour; their latencies are printed apart as the onset. Targets: the light chat beside a heavy
request under 1 s on the quiet box, and with the hog under twice its own
alone-latency with the hog.

    .venv/bin/python -m tests.bench.bench_heavy_neighbours [--rounds 3] [--hog] [--cases embed,pattern]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.daemon import RunningDaemon, start_daemon
from tests.security.test_heavy_requests import LIGHT, enum_schema, light_latency

HOG = [sys.executable, "-c", "while True: pass"]


def _schema(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _pattern(n: int) -> dict:
    alternatives = "|".join(f"choice{i:04d}" for i in range(n))
    return _schema("pick", {"type": "object", "properties": {"a": {"type": "string", "pattern": f"^({alternatives})$"}}})


def _chat(fmt: dict, max_tokens: int) -> dict:
    return {**LIGHT, "messages": [{"role": "user", "content": "Pick one."}], "max_tokens": max_tokens, "response_format": fmt}


#: name → (short name for --cases, path, body factory)
CASES: dict[str, tuple[str, str, Callable[[], dict]]] = {
    "5,000-string enum schema": ("enum5000", "/v1/chat/completions", lambda: _chat(enum_schema(5000), 64)),
    "256-value enum schema": ("enum256", "/v1/chat/completions", lambda: _chat(enum_schema(256), 24)),
    "512 embedding inputs": (
        "embed",
        "/v1/embeddings",
        lambda: {"model": "default", "input": [f"Sentence {i} about the weather by the sea." for i in range(512)]},
    ),
    "10 MB prompt": (
        "prompt10mb",
        "/v1/completions",
        lambda: {
            "model": "default",
            "prompt": "All work and no play makes Jack a dull boy. " * (10_000_000 // 44),
            "max_tokens": 4,
        },
    ),
    "1,800-token prompt": (
        "prompt1800",
        "/v1/completions",
        lambda: {"model": "default", "prompt": f"{time.time()} " + " ".join(f"word{i}" for i in range(470)), "max_tokens": 4},
    ),
    "schema bomb (minLength 2e8)": (
        "bomb",
        "/v1/chat/completions",
        lambda: _chat(_schema("bomb", {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}}), 16),
    ),
    "3,000-alternative pattern": ("pattern", "/v1/chat/completions", lambda: _chat(_pattern(3000), 16)),
}


class Hog:
    """One busy process for the duration of a ``with`` block (``on`` False: none).

    ``settle`` is called once the busy process runs, before the block: the benchmark
    sends a few untimed light chats there, so what the block measures is the box with
    a busy neighbour, not the engine's first steps after the neighbour appeared (those
    are reported apart, as the onset).
    """

    def __init__(self, on: bool, settle: Callable[[], None] | None = None) -> None:
        self.on = on
        self.settle = settle
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Hog:
        if self.on:
            self.proc = subprocess.Popen(HOG)
            time.sleep(0.5)
            if self.settle is not None:
                self.settle()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def beside(daemon: RunningDaemon, key: str, path: str, make: Callable[[], dict], lead: float) -> tuple[float, float, int]:
    """(light latency, heavy latency, heavy status) for one round: the heavy request, ``lead`` s later the light one."""
    out: dict = {}

    def heavy() -> None:
        with daemon.client(key, timeout=300) as c:
            t0 = time.perf_counter()
            try:
                out["status"] = c.post(path, json=make(), headers={"cache-control": "no-store"}).status_code
            except httpx.TimeoutException:
                out["status"] = "timeout (300 s)"
            out["s"] = time.perf_counter() - t0

    t = threading.Thread(target=heavy)
    t.start()
    time.sleep(lead)
    light = light_latency(daemon, key)
    t.join()
    return light, out["s"], out["status"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lead", type=float, default=0.5, help="seconds between the heavy request and the light one")
    ap.add_argument("--hog", action="store_true", help="also measure everything beside one busy process")
    ap.add_argument(
        "--settle", type=int, default=3, help="untimed light chats after the busy process starts (reported as the onset)"
    )
    ap.add_argument(
        "--cases", default="", help="comma-separated short names (default: all): " + ",".join(c[0] for c in CASES.values())
    )
    args = ap.parse_args()
    wanted = {c for c in args.cases.split(",") if c}
    cases = {name: v for name, v in CASES.items() if not wanted or v[0] in wanted}
    conditions = ["quiet", "hog"] if args.hog else ["quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        # the default per-key cap (256 embedding inputs in flight) answers 512 at once with a 429: lift it to measure the work
        daemon = start_daemon(Path(tmp), APPLIANCE_EMBEDDING_INPUTS_IN_FLIGHT_PER_KEY="1024")
        try:
            key = daemon.create_key("bench")
            light_latency(daemon, key)  # load the engine
            alone: dict[str, float] = {}
            onset: list[float] = []  # the light chats right after the busy process started, one list per start

            def settle() -> None:
                onset.extend(light_latency(daemon, key) for _ in range(args.settle))

            for cond in conditions:
                with Hog(cond == "hog", settle):
                    alone[cond] = statistics.median(light_latency(daemon, key) for _ in range(args.rounds))
            header = "".join(f" | light, {c} | heavy, {c}" for c in conditions)
            print(f"| case{header} | HTTP |")
            print("|---" * (1 + 2 * len(conditions)) + "|---|")
            print("| alone" + "".join(f" | {alone[c]:.2f} s | " for c in conditions) + " | |", flush=True)
            for name, (_, path, make) in cases.items():
                cells, statuses = [], set()
                for cond in conditions:
                    with Hog(cond == "hog", settle):
                        runs = [beside(daemon, key, path, make, args.lead) for _ in range(args.rounds)]
                    light = statistics.median(r[0] for r in runs)
                    heavy = statistics.median(r[1] for r in runs)
                    statuses |= {str(r[2]) for r in runs}
                    target = 1.0 if cond == "quiet" else 2 * alone[cond]
                    mark = "" if light < target else " (over target)"
                    cells.append(f" | {light:.2f} s{mark} | {heavy:.2f} s")
                print(f"| {name}{''.join(cells)} | {sorted(statuses)} |", flush=True)
            if onset:
                print(
                    f"\nonset: the {args.settle} untimed light chats after each start of the busy process took "
                    f"median {statistics.median(onset):.2f} s, max {max(onset):.2f} s ({len(onset)} chats)",
                    flush=True,
                )
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
