"""Latency of a light 4-token chat beside each heavy request (README security table, row 24).

Starts a real daemon on the default model, then for each heavy case (a
5,000-string enum schema, a 256-value enum schema, 512 embedding inputs, a
10 MB prompt, a 1,800-token prompt) runs a few rounds of: heavy request in
flight, one light chat timed. Prints the light chat's median latency beside
each case, and alone.

    .venv/bin/python -m tests.bench.bench_heavy_neighbours [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.daemon import start_daemon
from tests.security.test_heavy_requests import LIGHT, enum_schema, light_latency

CASES = {
    "5,000-string enum schema": (
        "/v1/chat/completions",
        lambda: {
            **LIGHT,
            "messages": [{"role": "user", "content": "Pick one."}],
            "max_tokens": 64,
            "response_format": enum_schema(5000),
        },
    ),
    "256-value enum schema": (
        "/v1/chat/completions",
        lambda: {
            **LIGHT,
            "messages": [{"role": "user", "content": "Pick one."}],
            "max_tokens": 24,
            "response_format": enum_schema(256),
        },
    ),
    "512 embedding inputs": (
        "/v1/embeddings",
        lambda: {"model": "default", "input": [f"Sentence {i} about the weather by the sea." for i in range(512)]},
    ),
    "10 MB prompt": (
        "/v1/completions",
        lambda: {
            "model": "default",
            "prompt": "All work and no play makes Jack a dull boy. " * (10_000_000 // 44),
            "max_tokens": 4,
        },
    ),
    "1,800-token prompt": (
        "/v1/completions",
        lambda: {"model": "default", "prompt": f"{time.time()} " + " ".join(f"word{i}" for i in range(470)), "max_tokens": 4},
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lead", type=float, default=0.5, help="seconds between the heavy request and the light one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp))
        try:
            key = daemon.create_key("bench")
            light_latency(daemon, key)  # load the engine
            alone = statistics.median(light_latency(daemon, key) for _ in range(args.rounds))
            print(f"{'alone':28s} light {alone:6.2f} s")
            for name, (path, make) in CASES.items():
                lights, heavies, statuses = [], [], []
                for _ in range(args.rounds):
                    out: dict = {}

                    def heavy(out: dict = out, path: str = path, make: Callable[[], dict] = make) -> None:
                        with daemon.client(key, timeout=300) as c:
                            t0 = time.perf_counter()
                            out["status"] = c.post(path, json=make(), headers={"cache-control": "no-store"}).status_code
                            out["s"] = time.perf_counter() - t0

                    t = threading.Thread(target=heavy)
                    t.start()
                    time.sleep(args.lead)
                    lights.append(light_latency(daemon, key))
                    t.join()
                    heavies.append(out["s"])
                    statuses.append(out["status"])
                print(
                    f"{name:28s} light {statistics.median(lights):6.2f} s   heavy {statistics.median(heavies):6.2f} s"
                    f"  (HTTP {sorted(set(statuses))})",
                    flush=True,
                )
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
