"""What the gateway costs: added latency, capacity under load, and CPU per streamed token.

The daemon is the real one (Host check, key auth, three quota counters on the
key, quota admission and settlement through the group-commit ledger, the exact
cache looked up and stored (every request differs, so it always misses), routing,
the admission queue, the engine client) in front of a stand-in engine that
answers at once (tests/bench/echo_daemon.py).

- Latency and capacity come from ``wrk``, a compiled load generator, so the
  client does not share Python's cost with the server. The daemon is pinned to
  the last core, wrk and the stand-in engine to the others (where the box has
  two or more cores). The engine alone is measured the same way on its TCP
  port (it listens on its Unix socket for the daemon and on 127.0.0.1 for wrk);
  gateway and engine rounds alternate, and the medians of the rounds are shown.
  Added latency = gateway − engine alone, at p50 and p99.
- CPU per streamed token: 8 concurrent streams of 128 tokens each, the daemon
  process's CPU time (user + system, its own process only) over the tokens
  relayed.

    python tests/bench/bench_gateway_overhead.py [--seconds 5] [--rounds 3] [--allocator jemalloc|system]

The daemon runs on the C allocator the real one uses by default (jemalloc, with
the same ``LD_PRELOAD`` and ``MALLOC_CONF``); ``--allocator system`` keeps glibc.

Needs ``wrk`` (Debian: ``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from appliance.allocator import LIBRARY, find_jemalloc, preload_environment  # noqa: E402
from appliance.settings import Settings  # noqa: E402
from tests.daemon import daemon_env, free_port  # noqa: E402

DEFAULT_ANONYMOUS_CAP = Settings.model_fields["anonymous_connections_per_address"].default

WRK_SCRIPT = """
local key = os.getenv("BENCH_KEY")
local n = 0
local tag = ""
function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
  tag = tostring(math.random(1, 2147483647))
end
function request()
  n = n + 1
  local body = '{"model":"echo","messages":[{"role":"user","content":"bench ' .. tag .. ' ' .. n .. '"}],'
    .. '"max_tokens":1,"temperature":0}'
  local headers = {["Content-Type"] = "application/json"}
  if key then headers["Authorization"] = "Bearer " .. key end
  return wrk.format("POST", "/v1/chat/completions", headers, body)
end
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert match, text
    return float(match[1]) * _UNITS[match[2]]


def wrk(url: str, connections: int, seconds: float, script: Path, cpus: set[int] | None, key: str | None) -> dict:
    """One wrk run: requests/s and latency percentiles (ms); any non-2xx answer is an error."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "30s", "-s", str(script), url]
    env = {**os.environ, **({"BENCH_KEY": key} if key else {})}
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        check=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    ).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw failures against {url}:\n{out}")
    percentiles = {int(float(p)): _ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)(?:\.0+)?%\s+(\S+)\s*$", out, re.M)}
    if 50 not in percentiles or 99 not in percentiles:
        raise RuntimeError(f"wrk's latency distribution could not be read:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    return {"rps": rps, "p50": percentiles[50], "p99": percentiles[99]}


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def stream_cpu(url: str, key: str, pid: int, streams: int = 8, tokens: int = 128, requests: int = 64) -> dict:
    """Daemon CPU seconds per streamed token over ``requests`` streams, ``streams`` at a time."""
    process = psutil.Process(pid)
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": "stream"}],
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0.7,
    }  # not deterministic: the cache stays out of the way
    counter = iter(range(requests))
    relayed = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal relayed
        for _ in counter:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        relayed += 1

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        await asyncio.gather(*(one(client) for _ in range(2)))  # warm
        counter = iter(range(requests))
        relayed = 0
        before = process.cpu_times()
        started = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(streams)))
        wall = time.perf_counter() - started
        after = process.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    assert relayed == requests * tokens, (relayed, requests * tokens)
    return {
        "tokens": relayed,
        "daemon_cpu_s": round(cpu, 3),
        "cpu_us_per_token": round(cpu / relayed * 1e6, 1),
        "tokens_per_s": round(relayed / wall),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating gateway/engine rounds per concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 100])
    parser.add_argument(
        "--cache",
        choices=("on", "off"),
        default="on",
        help="the response cache (on: looked up and stored on every request; off: to see its share)",
    )
    parser.add_argument(
        "--allocator",
        choices=("jemalloc", "system"),
        default="jemalloc",
        help="the daemon's C allocator, as the allocator setting (default jemalloc)",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    jemalloc = find_jemalloc() if args.allocator == "jemalloc" else None
    if args.allocator == "jemalloc" and jemalloc is None:
        sys.exit("libjemalloc2 is not installed (Debian: apt-get install libjemalloc2), or pass --allocator system")
    cores = sorted(os.sched_getaffinity(0))
    daemon_cpus = {cores[-1]} if len(cores) > 1 else None
    other_cpus = set(cores[:-1]) if len(cores) > 1 else None
    with tempfile.TemporaryDirectory() as tmp:
        port, engine_port = free_port(), free_port()
        data_dir = Path(tmp) / "data"
        script = Path(tmp) / "bench.lua"
        script.write_text(WRK_SCRIPT)
        env = daemon_env(
            data_dir,
            port,
            APPLIANCE_SEED_DEFAULT_MODEL="false",
            APPLIANCE_LOG_LEVEL="warning",
            APPLIANCE_QUEUE_SIZE="1024",
            # wrk opens all its connections at once, before any of them has sent a key: past this cap the daemon closes
            # the oldest of them as it would a stalled socket, so the cap covers the largest run.
            APPLIANCE_ANONYMOUS_CONNECTIONS_PER_ADDRESS=str(max(DEFAULT_ANONYMOUS_CAP, *args.concurrency)),
            APPLIANCE_CACHE_ENABLED=str(args.cache == "on").lower(),
            ECHO_ENGINE_TCP_PORT=str(engine_port),
        )
        if jemalloc is not None:
            env = preload_environment(jemalloc, env)
        with open(Path(tmp) / "daemon.log", "wb") as log:  # the daemon keeps its own copy of the descriptor
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("echo_daemon.py"))],
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=(lambda: os.sched_setaffinity(0, daemon_cpus)) if daemon_cpus else None,
            )
        try:
            admin_sock = data_dir / "run" / "admin.sock"
            deadline = time.monotonic() + 60
            while not admin_sock.exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((Path(tmp) / "daemon.log").read_text()[-2000:])
                time.sleep(0.2)
            if (LIBRARY in Path(f"/proc/{proc.pid}/maps").read_text()) != (jemalloc is not None):
                raise RuntimeError(f"the daemon is not running on the allocator asked for ({args.allocator})")
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(admin_sock)), base_url="http://appliance", timeout=60
            ) as admin:
                key = admin.post("/admin/keys/", json={"name": "bench"}).json()
                admin.put(
                    f"/admin/quotas/key:{key['prefix']}",
                    json={"requests_per_minute": 10_000_000, "tokens_per_day": 10**12, "cost_per_month": 10**9},
                ).raise_for_status()
                admin.post("/admin/instances/echo/load").raise_for_status()
            secret = key["secret"]
            for child in psutil.Process(proc.pid).children(recursive=True):  # the engine runs beside wrk, not the daemon
                if other_cpus:
                    child.cpu_affinity(sorted(other_cpus))
            gateway_url, engine_url = f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{engine_port}/"
            wrk(gateway_url, 8, 2, script, other_cpus, secret)  # warm both
            wrk(engine_url, 8, 1, script, other_cpus, None)
            rows = []
            for connections in args.concurrency:
                via, alone = [], []
                for _ in range(args.rounds):
                    alone.append(wrk(engine_url, connections, args.seconds, script, other_cpus, None))
                    via.append(wrk(gateway_url, connections, args.seconds, script, other_cpus, secret))
                g, e = medians(via), medians(alone)
                rows.append(
                    {
                        "concurrency": connections,
                        "gateway_rps": round(g["rps"]),
                        "engine_rps": round(e["rps"]),
                        "gateway_p50_ms": round(g["p50"], 3),
                        "gateway_p99_ms": round(g["p99"], 3),
                        "engine_p50_ms": round(e["p50"], 3),
                        "engine_p99_ms": round(e["p99"], 3),
                        "added_p50_ms": round(g["p50"] - e["p50"], 3),
                        "added_p99_ms": round(g["p99"] - e["p99"], 3),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(admin_sock)), base_url="http://appliance", timeout=60
            ) as admin:
                ledger = admin.get("/admin/usage", params={"key": key["prefix"]}).json()
            streaming = asyncio.run(stream_cpu(gateway_url.rstrip("/"), secret, proc.pid))
            print(json.dumps({"streaming": streaming}), flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    print(
        f"\nresponse cache {args.cache}; allocator {args.allocator}; cores: daemon on "
        f"{sorted(daemon_cpus) if daemon_cpus else 'all'}, wrk and engine on "
        f"{sorted(other_cpus) if other_cpus else 'all'}; {args.rounds} rounds of {args.seconds:g} s, medians"
    )
    print("\n| in flight | gateway req/s | engine alone req/s | gateway p50 | gateway p99 | added p50 | added p99 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['gateway_rps']:,} | {r['engine_rps']:,} | {r['gateway_p50_ms']:.2f} ms | "
            f"{r['gateway_p99_ms']:.2f} ms | **{r['added_p50_ms']:.2f} ms** | **{r['added_p99_ms']:.2f} ms** |"
        )
    by = {r["concurrency"]: r for r in rows}
    if 16 in by and 100 in by:
        print(
            f"\nthroughput at 100 in flight / at 16: {by[100]['gateway_rps'] / by[16]['gateway_rps']:.2f}; "
            f"p99/p50 at 100: {by[100]['gateway_p99_ms'] / by[100]['gateway_p50_ms']:.1f}"
        )
    print(
        f"streamed: {streaming['tokens']} tokens over 8 streams, daemon CPU {streaming['cpu_us_per_token']} µs per token "
        f"({streaming['tokens_per_s']:,} tokens/s relayed)"
    )
    print(f"ledger: {json.dumps(ledger)[:300]}")


if __name__ == "__main__":
    main()
