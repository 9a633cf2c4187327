"""Soak: a real daemon under mixed load for minutes, checked for leaks and lost requests.

    python tests/bench/soak.py --minutes 10 [--threads 4] [--json soak.json] [--allocator system --heap-log heap.txt]

Load, all at once, for ``--minutes``:

* ``--threads`` clients on one key cycling through chat, streamed chat (with
  usage), completions, embeddings, and one repeated temperature-0 question
  (response-cache hits where the cache is on), all on the tiny model; the
  response cache is capped at ``--cache-entries`` so that it is full early;
* a churn client: every few seconds it makes a key, uses it, revokes it and
  checks that the very next request with it is refused (401);
* a model client: it unloads and reloads a second model through the admin API
  and asks it a question after each load (load on demand, eviction, unload).

Every 10 s it samples the resident memory and open file descriptors of the
daemon and of the tiny model's engine (and of the whole process tree).

Checks, each printed with its figures; the exit status is 1 if any fails:

* no request that should succeed failed;
* the ledger (``GET /admin/usage?format=json``) equals what the clients counted:
  requests, prompt and completion tokens of the load key, and all requests;
* memory does not leak: for the daemon and the long-lived engine, a least-squares
  line through the per-minute mean RSS of the last 40 minutes (all minutes after
  the first, warm-up, in a shorter run) has a slope whose upper 95 % confidence
  bound is at most :data:`LEAK_BOUND_MIB_PER_MIN` (0.05 MiB/min, about 0.5 GiB a
  week); the slope and its interval are printed;
* file descriptors are stable: the last third's maximum is at most the first
  third's maximum + 16;
* the database passes ``PRAGMA integrity_check`` and the daemon stops cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.ggufkit import make_tiny_gguf  # noqa: E402
from tests.reliability.kit import (  # noqa: E402
    TINY,
    MixedLoad,
    Outcome,
    chat_body,
    engine_pid,
    import_model,
    start_daemon,
    tree_fds,
    tree_pids,
    tree_rss,
)

SECOND = "tiny-b:f32"
SAMPLE_EVERY_S = 10.0
MIB = 1 << 20
#: Most RSS growth a soak may show (upper 95 % bound of the fitted slope), and the minutes it is fitted over.
LEAK_BOUND_MIB_PER_MIN = 0.05
LEAK_WINDOW_MIN = 40
#: Two-sided 95 % quantiles of Student's t for small degrees of freedom (1.96 beyond the table).
T95 = {
    1: 12.71,
    2: 4.30,
    3: 3.18,
    4: 2.78,
    5: 2.57,
    6: 2.45,
    7: 2.36,
    8: 2.31,
    9: 2.26,
    10: 2.23,
    12: 2.18,
    15: 2.13,
    20: 2.09,
    25: 2.06,
    30: 2.04,
    40: 2.02,
    60: 2.00,
}


class Churn(threading.Thread):
    """Key revocations, and unload/load cycles of a second model."""

    def __init__(self, daemon, kind: str, every_s: float):
        super().__init__(daemon=True, name=f"churn-{kind}")
        self.box, self.kind, self.every_s = daemon, kind, every_s
        self.stop_event = threading.Event()
        self.outcomes: list[Outcome] = []
        self.events: list[str] = []
        self.failures: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop_event.wait(self.every_s):
            n += 1
            try:
                self.revoke_cycle(n) if self.kind == "keys" else self.load_cycle(n)
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                self.failures.append(f"{self.kind} cycle {n}: {type(exc).__name__}: {exc}")

    def _ask(self, key: str, model: str, op: str) -> httpx.Response:
        with httpx.Client(base_url=self.box.url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            started = time.monotonic()
            response = client.post("/v1/chat/completions", json=chat_body(f"{op} question", model=model, max_tokens=8))
            ok = response.status_code == 200
            usage = response.json().get("usage", {}) if ok else {}
            self.outcomes.append(
                Outcome(
                    op,
                    response.status_code,
                    response.headers.get("x-request-id"),
                    ok,
                    response.headers.get("x-cache"),
                    None if ok else response.text[:300],
                    time.monotonic() - started,
                    int(usage.get("prompt_tokens") or 0),
                    int(usage.get("completion_tokens") or 0),
                )
            )
            return response

    def revoke_cycle(self, n: int) -> None:
        key = self.box.create_key(f"soak-churn-{n}")
        self._ask(key, TINY, "churn-key")
        with self.box.admin() as admin:
            assert admin.delete(f"/admin/keys/{key[:12]}").status_code == 200
        with httpx.Client(base_url=self.box.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            after = client.get("/v1/models").status_code
        if after != 401:
            self.failures.append(f"revoked key {key[:12]} answered {after}, not 401")
        self.events.append("revoked")

    def load_cycle(self, n: int) -> None:
        with self.box.admin() as admin:
            if n % 2:
                assert admin.post(f"/admin/instances/{SECOND}/unload").status_code == 200
                self.events.append("unload")
            else:
                assert admin.post(f"/admin/instances/{SECOND}/load").status_code == 200
                self.events.append("load")
        self._ask(self.box.load_key, SECOND, "second-model")  # loads on demand after an unload


def sample(daemon, tiny_engine: int) -> dict:
    daemon_proc = psutil.Process(daemon.proc.pid)
    engine = psutil.Process(tiny_engine)
    return {
        "t": time.monotonic(),
        "daemon_rss": daemon_proc.memory_info().rss,
        "daemon_fds": daemon_proc.num_fds(),
        "engine_rss": engine.memory_info().rss,
        "engine_fds": engine.num_fds(),
        "tree_rss": tree_rss(daemon.proc.pid),
        "tree_fds": tree_fds(daemon.proc.pid),
        "processes": len(tree_pids(daemon.proc.pid)),
    }


def thirds(samples: list[dict], field: str) -> tuple[list[float], list[float]]:
    k = max(1, len(samples) // 3)
    return [s[field] for s in samples[:k]], [s[field] for s in samples[-k:]]


def per_minute(samples: list[dict], field: str, started: float) -> list[tuple[float, float]]:
    """(minute, mean of ``field`` in MiB) for each whole minute sampled, in order.

    A minute with fewer than half of its samples is left out: the sample taken at the deadline
    opens a minute of its own, and one reading (taken during a roll-up, say) is not a minute's mean.
    """
    buckets: dict[int, list[float]] = {}
    for s in samples:
        buckets.setdefault(int((s["t"] - started) // 60), []).append(s[field] / MIB)
    least = 60 / SAMPLE_EVERY_S / 2
    return [(m, statistics.mean(v)) for m, v in sorted(buckets.items()) if len(v) >= least]


def slope_with_interval(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares slope of ``points`` and its 95 % confidence interval (units of y per unit of x)."""
    n = len(points)
    if n < 3:
        return 0.0, float("-inf"), float("inf")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    mx = statistics.mean(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in points) / (n - 2)
    se = (residual / sxx) ** 0.5
    df = n - 2
    t = next((T95[k] for k in sorted(T95) if k >= df), 1.96)
    return slope, slope - t * se, slope + t * se


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir or tempfile.mkdtemp(prefix="soak-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.minutes} min, {args.threads} load threads, data under {base}", flush=True)
    probe = {}
    if args.heap_log:  # the daemon logs its C heap once a minute (tests/bench/heap_probe)
        folder = str(Path(__file__).resolve().parent / "heap_probe")
        probe = {
            "SOAK_HEAP_LOG": str(Path(args.heap_log).resolve()),
            "PYTHONPATH": os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])),
        }
    daemon = start_daemon(
        base,
        APPLIANCE_ENGINE_PARALLEL="4",
        APPLIANCE_QUEUE_SIZE="256",
        APPLIANCE_CACHE_MAX_ENTRIES=str(args.cache_entries),
        APPLIANCE_ALLOCATOR=args.allocator,
        **probe,
    )
    checks: dict[str, tuple[bool, str]] = {}
    report: dict = {
        "minutes": args.minutes,
        "threads": args.threads,
        "cache_max_entries": args.cache_entries,
        "allocator": args.allocator,
        "load_avg_start": os.getloadavg(),
    }
    try:
        import_model(daemon, make_tiny_gguf(base / "tiny.gguf"), TINY)
        import_model(daemon, make_tiny_gguf(base / "tiny-b.gguf", seed=7), SECOND)
        key = daemon.create_key("soak")
        daemon.load_key = key
        with daemon.admin() as admin:
            admin.post(f"/admin/instances/{TINY}/load?pin=true")  # the long-lived engine whose memory is watched
        tiny_engine = engine_pid(daemon)

        mixed = MixedLoad(daemon.url, key, ["chat", "stream", "completion", "embedding", "cached"], threads=args.threads).start()
        churn = [Churn(daemon, "keys", 5.0), Churn(daemon, "models", 15.0)]
        for c in churn:
            c.start()
        samples: list[dict] = []
        started = time.monotonic()
        warmup = min(60.0, args.minutes * 60 / 10)
        deadline = started + args.minutes * 60
        next_sample = started + warmup
        while time.monotonic() < deadline:
            time.sleep(max(0.0, min(next_sample, deadline) - time.monotonic()))
            if time.monotonic() >= next_sample:
                samples.append(sample(daemon, tiny_engine))
                s = samples[-1]
                print(
                    f"  t={s['t'] - started:5.0f}s requests={len(mixed.outcomes):6d} daemon {s['daemon_rss'] / MIB:6.1f} MiB "
                    f"{s['daemon_fds']} fds | engine {s['engine_rss'] / MIB:6.1f} MiB | tree {s['tree_rss'] / MIB:6.1f} MiB "
                    f"{s['tree_fds']} fds {s['processes']} procs",
                    flush=True,
                )
                next_sample += SAMPLE_EVERY_S
        for c in churn:
            c.stop_event.set()
        outcomes = mixed.stop()
        for c in churn:
            c.join(180)
        elapsed = time.monotonic() - started

        # -- requests
        churn_outcomes = [o for c in churn for o in c.outcomes]
        every = outcomes + churn_outcomes
        failed = [o for o in every if not o.acknowledged]
        churn_failures = [f for c in churn for f in c.failures]
        by_op: dict[str, dict] = {}
        for o in every:
            entry = by_op.setdefault(o.op, {"n": 0, "failed": 0, "latency": []})
            entry["n"] += 1
            entry["failed"] += not o.acknowledged
            entry["latency"].append(o.seconds)
        report["requests"] = {
            op: {
                "n": e["n"],
                "failed": e["failed"],
                "p50_ms": round(percentile(e["latency"], 0.5) * 1000, 1),
                "p95_ms": round(percentile(e["latency"], 0.95) * 1000, 1),
            }
            for op, e in sorted(by_op.items())
        }
        report["requests_per_second"] = round(len(every) / elapsed, 1)
        report["cache"] = {tier: sum(1 for o in every if o.cache == tier) for tier in ("exact", "semantic", "miss", None)}
        report["churn"] = {
            event: sum(1 for c in churn for e in c.events if e == event) for event in ("revoked", "load", "unload")
        }
        checks["no request that should succeed failed"] = (
            not failed and not churn_failures,
            f"{len(every)} requests, {len(failed)} failed {[asdict(o) for o in failed[:3]]}, churn problems {churn_failures[:3]}",
        )

        # -- ledger = client-side counts
        with daemon.admin() as admin:
            report["cache_stats"] = admin.get("/admin/cache/stats").json()
            mine = admin.get("/admin/usage", params={"key": key[:12], "format": "json"}).json()["totals"]
            everything = admin.get("/admin/usage", params={"format": "json"}).json()["totals"]
        load_key = [o for o in outcomes] + [o for o in churn_outcomes if o.op == "second-model"]
        client = {
            "requests": len(load_key),
            "prompt_tokens": sum(o.prompt_tokens for o in load_key),
            "completion_tokens": sum(o.completion_tokens for o in load_key),
        }
        ledger = {k: mine[k] for k in client}
        report["ledger"] = {
            "load key": ledger,
            "client": client,
            "all requests": everything["requests"],
            "all client": len(every),
        }
        checks["ledger equals the client-side count"] = (
            ledger == client and mine["failed"] == 0 and everything["requests"] == len(every),
            f"ledger {ledger} (failed {mine['failed']}), clients {client}; all: ledger {everything['requests']}, clients "
            f"{len(every)}",
        )

        # -- memory and descriptors
        report["rss_per_minute_mib"] = {}
        for name in ("daemon", "engine"):
            minutes = per_minute(samples, f"{name}_rss", started)
            window = minutes[-LEAK_WINDOW_MIN:]
            slope, low, high = slope_with_interval(window)
            report["rss_per_minute_mib"][name] = [round(v, 2) for _, v in minutes]
            checks[f"{name} memory does not leak"] = (
                high <= LEAK_BOUND_MIB_PER_MIN,
                f"over minutes {window[0][0] if window else 0:.0f}-{window[-1][0] if window else 0:.0f}: slope {slope:+.3f} "
                "MiB/min, "
                f"95% interval [{low:+.3f}, {high:+.3f}] (bound {LEAK_BOUND_MIB_PER_MIN}); "
                f"{window[0][1] if window else 0:.1f} -> {window[-1][1] if window else 0:.1f} MiB",
            )
            first, last = thirds(samples, f"{name}_fds")
            checks[f"{name} file descriptors stable"] = (
                max(last) <= max(first) + 16,
                f"first third max {max(first)}, last third max {max(last)}",
            )
        first, last = thirds(samples, "tree_rss")
        report["tree_rss_mib"] = {
            "first_third": round(statistics.mean(first) / MIB, 1),
            "last_third": round(statistics.mean(last) / MIB, 1),
        }
        report["samples"] = len(samples)
    finally:
        code = daemon.stop(120)
        report["load_avg_end"] = os.getloadavg()
    conn = sqlite3.connect(daemon.data_dir / "appliance.db")
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    checks["database intact, clean stop"] = (integrity == "ok" and code == 0, f"integrity {integrity}, exit code {code}")

    print(json.dumps(report, indent=1, default=str))
    for name, (ok, detail) in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"report": report, "checks": {k: {"ok": v[0], "detail": v[1]} for k, v in checks.items()}}, indent=1, default=str
            )
        )
    return 0 if all(ok for ok, _ in checks.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to load the daemon (default 10)")
    parser.add_argument("--threads", type=int, default=4, help="load clients on the main key (default 4)")
    parser.add_argument(
        "--cache-entries",
        type=int,
        default=2000,
        help="APPLIANCE_CACHE_MAX_ENTRIES (default 2000: the response cache, whose semantic index lives in "
        "memory, is full within the first minutes, so growth after that is a leak, not the cache filling)",
    )
    parser.add_argument("--dir", help="folder for the daemon's data (default: a new temporary folder)")
    parser.add_argument("--json", help="also write the report and checks to this file")
    parser.add_argument(
        "--heap-log",
        help="the daemon appends its RSS and glibc heap figures (mallinfo2) to this file each minute "
        "(glibc's figures mean something with --allocator system only)",
    )
    parser.add_argument("--allocator", choices=("jemalloc", "system"), default="jemalloc", help="the daemon's allocator setting")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
