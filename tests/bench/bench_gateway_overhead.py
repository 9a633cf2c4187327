"""Latency the gateway adds: the same request sent to the engine's socket directly and through the gateway.

The daemon is the real one (Host check, key auth, quota admission, cache
lookup and store, routing, admission queue, metering with a durable ledger
row before the last byte), in front of a stand-in engine that answers at once
(tests/bench/echo_daemon.py). Direct and gateway batches alternate, so both
see the same machine. Overhead = gateway latency − direct latency, at p50 and p99.

    python tests/bench/bench_gateway_overhead.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.daemon import daemon_env, free_port  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def batch(client: httpx.AsyncClient, path: str, concurrency: int, count: int, tag: str) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(count))

    async def worker() -> None:
        for i in counter:
            body = {"model": "echo", "messages": [{"role": "user", "content": f"{tag} request {i} {time.time_ns()}"}],
                    "max_tokens": 1, "temperature": 0}
            started = time.perf_counter()
            response = await client.post(path, json=body)
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def measure(gateway: httpx.AsyncClient, direct: httpx.AsyncClient, concurrency: int, requests: int, rounds: int = 4) -> dict:
    via, raw = [], []
    per_round = max(concurrency, requests // rounds)
    await batch(gateway, "/v1/chat/completions", concurrency, concurrency, "warm")
    await batch(direct, "/v1/chat/completions", concurrency, concurrency, "warm")
    for r in range(rounds):
        raw += await batch(direct, "/v1/chat/completions", concurrency, per_round, f"d{r}")
        via += await batch(gateway, "/v1/chat/completions", concurrency, per_round, f"g{r}")
    ms = 1000
    return {
        "concurrency": concurrency, "requests_each": len(via),
        "direct_p50_ms": round(pct(raw, 50) * ms, 3), "direct_p99_ms": round(pct(raw, 99) * ms, 3),
        "gateway_p50_ms": round(pct(via, 50) * ms, 3), "gateway_p99_ms": round(pct(via, 99) * ms, 3),
        "overhead_p50_ms": round((pct(via, 50) - pct(raw, 50)) * ms, 3), "overhead_p99_ms": round((pct(via, 99) - pct(raw, 99)) * ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per path and concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 100])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        data_dir = Path(tmp) / "data"
        env = daemon_env(data_dir, port, APPLIANCE_SEED_DEFAULT_MODEL="false", APPLIANCE_LOG_LEVEL="warning", APPLIANCE_QUEUE_SIZE="1024")
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("echo_daemon.py"))], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "daemon.log", "wb"))
        try:
            admin_sock = data_dir / "run" / "admin.sock"
            deadline = time.monotonic() + 60
            while not admin_sock.exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((Path(tmp) / "daemon.log").read_text()[-2000:])
                time.sleep(0.2)
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(admin_sock)), base_url="http://appliance", timeout=60) as admin:
                key = admin.post("/admin/keys/", json={"name": "bench"}).json()["secret"]
                admin.post("/admin/instances/echo/load").raise_for_status()
            engine_sock = data_dir / "run" / "echo.sock"

            async def run() -> list[dict]:
                limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                                             limits=limits, timeout=60) as gateway, \
                        httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(engine_sock)), base_url="http://engine",
                                          limits=limits, timeout=60) as direct:
                    return [await measure(gateway, direct, c, args.requests) for c in args.concurrency]

            rows = asyncio.run(run())
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    for row in rows:
        print(json.dumps(row))
    print("\n| concurrent | direct p50 | gateway p50 | overhead p50 | direct p99 | gateway p99 | overhead p99 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['direct_p50_ms']:.2f} ms | {r['gateway_p50_ms']:.2f} ms | **{r['overhead_p50_ms']:.2f} ms** | "
              f"{r['direct_p99_ms']:.2f} ms | {r['gateway_p99_ms']:.2f} ms | **{r['overhead_p99_ms']:.2f} ms** |")


if __name__ == "__main__":
    main()
