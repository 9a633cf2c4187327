"""What a /metrics scrape costs with the ledger's live figures, by ledger size.

Fills a real SQLite ledger (the project's schema) with N requests spread evenly over the last day (two models,
both classes, a tenth batch lines), then times, for each window, a fresh read (the range query on
ix_usage_created plus attainment and economics in Python: what a scrape pays once per refresh period) and a
cached scrape (Metrics.render with every figure gauge, as a Prometheus scrape within the period).

    .venv/bin/python -m tests.bench.bench_figures_scrape [N ...]
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from appliance.metering.attainment import WINDOWS
from appliance.metering.box_figures import BoxFigures, register_figure_gauges
from appliance.metrics import Metrics
from appliance.settings import Settings
from tests.meterkit import Clock, add_key, new_db


def fill(db_path: str, n: int, now: float, keys: tuple[int, int]) -> None:
    rng = random.Random(n)
    rows = []
    for i in range(n):
        t = now - 86400 * (i + 0.5) / n
        ttft = rng.uniform(20, 3000)
        tokens = rng.randint(1, 300)
        rows.append(
            (f"r{i}", t, keys[i % 2], "chat", ("a:q4", "b:q8")[i % 3 == 0], 40, tokens, 0, ttft,
             ttft + tokens * rng.uniform(5, 200), 200 if i % 50 else 503, "miss" if i % 7 else "exact", 0.0, None,
             f"batch_{i}" if i % 10 == 0 else None)
        )  # fmt: skip
    with sqlite3.connect(db_path) as conn:
        conn.executemany(
            "INSERT INTO usage (request_id, created_at, key_id, endpoint, model, prompt_tokens, completion_tokens, cached_tokens,"
            " ttft_ms, latency_ms, status, cache_tier, cost, energy_joules, batch_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )


def main(sizes: list[int]) -> None:
    print("| ledger rows (1 day) | fresh read 5m (ms) | fresh read 1h (ms) | fresh read 1d (ms) | scrape (ms) |")
    print("|---|---|---|---|---|")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            db = new_db(Path(tmp) / "a.db")
            keys = (add_key(db, "i").id, add_key(db, "b").id)
            now = time.time()
            fill(db.url.database, n, now, keys)  # type: ignore[arg-type]
            settings = Settings(data_dir=Path(tmp), box_cost_per_hour=2.0, energy_price_per_kwh=0.3, box_power_watts=400)
            capacity = {"a:q4": 150.0, "b:q8": 80.0}.copy
            fresh: dict[str, float] = {}
            for window in WINDOWS:
                times = []
                for _ in range(3):
                    figures = BoxFigures(settings, db, capacity, clock=Clock(now))  # nothing cached
                    started = time.perf_counter()
                    figures.window(window)
                    times.append(time.perf_counter() - started)
                fresh[window] = statistics.median(times) * 1000
            figures.refresh()
            metrics = Metrics()
            register_figure_gauges(metrics, figures)
            cached = []
            for _ in range(20):
                started = time.perf_counter()
                metrics.render()
                cached.append(time.perf_counter() - started)
            db.dispose()
        print(
            f"| {n:,} | {fresh['5m']:.1f} | {fresh['1h']:.1f} | {fresh['1d']:.1f} | {statistics.median(cached) * 1000:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10_000, 100_000, 500_000])
