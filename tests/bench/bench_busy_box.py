"""Short completions on a quiet box and beside one busy process: the appliance against llama-server.

An edge box always has other work. With OpenMP compute threads, one descheduled
thread makes the others spin at the graph's next barrier, so a busy neighbour can
cost an engine far more than the core it takes. This measures what a user feels:
the median and the slowest of short (4-token, greedy) completions, each target
asked in turn (interleaved), first on the box as it is ("quiet"), then with one
``python -c "while True: pass"`` running for the whole condition ("hog").

Targets, all on a fresh copy of the default model with 2 compute threads:

- ``appliance``: the daemon (gateway + worker), threads chosen by the planner, the
  worker adapting its compute threads to contention (the default);
- ``worker, adapt on``: the worker alone, as the daemon starts it (no gateway in front);
- ``worker, adapt on, OMP passive``: the same with ``OMP_WAIT_POLICY=PASSIVE``;
- ``worker, adapt off``: the worker alone with ``--adapt-threads off`` (``engine_adapt_threads = false``);
- ``worker, adapt off, OMP passive``: the same with ``OMP_WAIT_POLICY=PASSIVE``
  (threads sleep at barriers instead of spinning);
- ``llama-server -t 2``: llama.cpp's C++ server (``compare_servers.build_llama_server()``,
  cached under ~/.cache/appliance-bench).

    .venv/bin/python -m tests.bench.bench_busy_box [--requests 5] [--rounds 2] [--llama-server PATH]

Targets: beside one busy process the appliance's median and max at most llama-server's;
quiet figures no worse than before (``worker, adapt off``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.bench.compare_servers import (
    build_llama_server,
    daemon_worker_socket,
    free_port,
    fresh_model_copy,
    start_process,
    stop_process,
)
from tests.daemon import start_daemon

_n = itertools.count()
HOG = [sys.executable, "-c", "while True: pass"]
#: A 4-token completion unanswered this long is a fault, not a slow answer.
TIMEOUT_S = 120.0


@dataclass
class Target:
    name: str
    client: httpx.Client
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    stats_client: httpx.Client | None = None  # the worker's /stats, where the target has one

    def complete(self) -> float:
        body = {"model": self.model, "prompt": f"Note {next(_n)}: the weather today is", "max_tokens": 4, "temperature": 0}
        t0 = time.perf_counter()
        r = self.client.post("/v1/completions", json=body, headers=self.headers)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status_code} {r.text[:300]}")
        return dt


def start_worker(model: Path, socket: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "appliance.drivers.llamacpp.worker", "--model", str(model), "--socket", socket]
    argv += ["--served-name", "m", "--ctx", "2048", "--parallel", "8", "--threads", "2", *extra]
    return subprocess.Popen(
        argv, env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})}, start_new_session=True, stderr=subprocess.DEVNULL
    )


def uds_client(socket: str) -> httpx.Client:
    deadline = time.monotonic() + 120
    client = httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://worker", timeout=TIMEOUT_S)
    while time.monotonic() < deadline:
        try:
            if client.get("/health").status_code == 200:
                return client
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"worker on {socket} not healthy")


def run_condition(targets: list[Target], requests: int, out: dict[str, list[float]]) -> None:
    for _ in range(requests):
        for t in targets:
            try:
                out[t.name].append(t.complete())
            except httpx.TimeoutException as exc:
                raise RuntimeError(f"{t.name}: a 4-token completion got no answer in {TIMEOUT_S:g} s") from exc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5, help="completions per target per condition and round")
    ap.add_argument("--rounds", type=int, default=2, help="quiet/hog rounds (interleaved)")
    ap.add_argument("--llama-server", type=Path)
    ap.add_argument("--skip-llama-server", action="store_true", help="leave the yardstick out (no build)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between starting the hog and the first request")
    args = ap.parse_args()
    binary = None if args.skip_llama_server else args.llama_server or build_llama_server()
    procs: list[subprocess.Popen] = []
    clients: list[httpx.Client] = []
    daemon = None
    with tempfile.TemporaryDirectory() as tmp:
        model = fresh_model_copy(Path(tmp))
        try:
            port = free_port()
            if binary is not None:
                server = [str(binary), "-m", str(model), "--port", str(port), "-np", "8", "-c", "16384", "-t", "2", "--no-webui"]
                env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
                procs.append(start_process(server, f"http://127.0.0.1:{port}/health", env=env))
            on_sock, off_sock, passive_sock = (os.path.join(tmp, f"{n}.sock") for n in ("on", "off", "passive"))
            on_passive_sock = os.path.join(tmp, "on-passive.sock")
            procs.append(start_worker(model, on_sock))
            procs.append(start_worker(model, on_passive_sock, env={"OMP_WAIT_POLICY": "PASSIVE"}))
            procs.append(start_worker(model, off_sock, "--adapt-threads", "off"))
            procs.append(start_worker(model, passive_sock, "--adapt-threads", "off", env={"OMP_WAIT_POLICY": "PASSIVE"}))
            daemon = start_daemon(Path(tmp), APPLIANCE_CACHE_ENABLED="false", APPLIANCE_ENGINE_PARALLEL="8")
            key = daemon.create_key("bench")
            clients += [httpx.Client(base_url=daemon.url, timeout=TIMEOUT_S), uds_client(on_sock), uds_client(off_sock)]
            clients += [uds_client(passive_sock), uds_client(on_passive_sock)]
            targets = [
                Target("appliance", clients[0], "default", {"authorization": f"Bearer {key}", "cache-control": "no-store"}),
                Target("worker, adapt on", clients[1], "m"),
                Target("worker, adapt on, OMP passive", clients[4], "m"),
                Target("worker, adapt off", clients[2], "m"),
                Target("worker, adapt off, OMP passive", clients[3], "m"),
            ]
            if binary is not None:
                clients.append(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT_S))
                targets.append(Target("llama-server -t 2", clients[-1], "x"))
            for t in targets:  # loads the daemon's engine, warms every server
                t.complete()
            sock = daemon_worker_socket(daemon.data_dir)
            if sock:
                targets[0].stats_client = uds_client(str(sock))
                clients.append(targets[0].stats_client)
            lat: dict[str, dict[str, list[float]]] = {c: {t.name: [] for t in targets} for c in ("quiet", "hog")}
            for r in range(args.rounds):
                run_condition(targets, args.requests, lat["quiet"])
                hog = subprocess.Popen(HOG)
                try:
                    time.sleep(args.settle)
                    run_condition(targets, args.requests, lat["hog"])
                finally:
                    hog.kill()
                    hog.wait()
                time.sleep(args.settle)
                print(f"round {r + 1}/{args.rounds} done", flush=True)
            if targets[0].stats_client is not None:
                s = targets[0].stats_client.get("/stats").json()
                print(
                    "appliance worker threads: " + ", ".join(f"{k}={v}" for k, v in s.items() if k.startswith("threads_")),
                    flush=True,
                )
        finally:
            for c in clients:
                c.close()
            if daemon is not None:
                daemon.stop()
            for p in procs:
                if binary is not None and p.args and str(p.args[0]) == str(binary):
                    stop_process(p)
                else:
                    p.terminate()
                    p.wait()
    n = args.rounds * args.requests
    print(f"\n{n} four-token completions per target and condition, interleaved; median (max) in seconds\n")
    print("| target | quiet | one busy process |")
    print("|---|---|---|")
    for t in targets:
        q, h = lat["quiet"][t.name], lat["hog"][t.name]
        print(f"| {t.name} | {statistics.median(q):.2f} s ({max(q):.2f}) | {statistics.median(h):.2f} s ({max(h):.2f}) |")
    if binary is None:
        return
    ours, ref = lat["hog"]["appliance"], lat["hog"]["llama-server -t 2"]
    print(
        f"\nwith one busy process: appliance median {statistics.median(ours):.2f} s vs llama-server "
        f"{statistics.median(ref):.2f} s (target <=), max {max(ours):.2f} s vs {max(ref):.2f} s (target <=)"
    )


if __name__ == "__main__":
    main()
