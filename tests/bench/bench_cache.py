"""Exact cache hits through the real daemon: latency p50/p95 and requests per second.

    python tests/bench/bench_cache.py [--latency-requests 2000] [--seconds 10] [--procs 1] [--conns 16]

Starts the daemon (tests/daemon.py) in a temporary data dir with the default
model, primes one deterministic chat request, then replays it:

1. latency: one keep-alive connection, one request at a time, raw sockets
   (so the client adds as little as possible); time from send to the last byte.
2. throughput: `--procs` load-generator processes, each keeping `--conns`
   keep-alive connections busy with a selector loop; bounded by `--seconds`.

The load generator shares the machine (and its cores) with the daemon, so the
throughput figure is a floor, not the daemon's ceiling. Every response must be
200 with `x-cache: exact`; others are counted and reported.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import selectors
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.daemon import start_daemon  # noqa: E402

BODY = json.dumps(
    {
        "model": "default",
        "messages": [{"role": "user", "content": "Name a colour of the sky."}],
        "max_tokens": 8,
        "temperature": 0,
    }
).encode()


def request_bytes(key: str) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(BODY)).encode()
        + b"\r\n\r\n"
        + BODY
    )


class Conn:
    """One keep-alive HTTP/1.1 connection that parses Content-Length responses."""

    def __init__(self, port: int, payload: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.payload = payload
        self.buf = b""

    def send(self) -> None:
        self.sock.sendall(self.payload)

    def feed(self, data: bytes) -> tuple[int, bool] | None:
        """Add received bytes; returns (status, exact_hit) once a whole response is in."""
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        head = self.buf[:head_end].lower()
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        total = head_end + 4 + length
        if len(self.buf) < total:
            return None
        self.buf = self.buf[total:]
        return int(head[9:12]), b"x-cache: exact" in head

    def roundtrip(self) -> tuple[int, bool]:
        self.send()
        while True:
            done = self.feed(self.sock.recv(65536))
            if done:
                return done


def load_worker(port: int, payload: bytes, conns: int, seconds: float, max_requests: int, start_at: float, out: mp.Queue) -> None:
    sel = selectors.DefaultSelector()
    pool = [Conn(port, payload) for _ in range(conns)]
    while time.time() < start_at:
        time.sleep(0.001)
    deadline = time.monotonic() + seconds
    ok = bad = 0
    for c in pool:
        c.send()
        sel.register(c.sock, selectors.EVENT_READ, c)
    while time.monotonic() < deadline and ok + bad < max_requests:
        for key, _ in sel.select(timeout=1.0):
            c = key.data
            done = c.feed(c.sock.recv(65536))
            if done:
                status, exact = done
                ok, bad = (ok + 1, bad) if status == 200 and exact else (ok, bad + 1)
                c.send()
    out.put((ok, bad))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=200_000, help="per load process")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp), APPLIANCE_LOG_LEVEL="warning")
        try:
            key = daemon.create_key("bench")
            payload = request_bytes(key)
            conn = Conn(daemon.port, payload)
            status, exact = conn.roundtrip()  # miss: loads the model and fills the cache
            assert status == 200, status
            for _ in range(50):
                status, exact = conn.roundtrip()
                if exact:
                    break
                time.sleep(0.05)
            assert exact, "the primed request never became an exact hit"

            for _ in range(200):  # warm up
                conn.roundtrip()
            times, misses = [], 0
            for _ in range(args.latency_requests):
                t = time.perf_counter()
                status, exact = conn.roundtrip()
                times.append((time.perf_counter() - t) * 1000)
                misses += not (status == 200 and exact)
            times.sort()
            p50 = statistics.median(times)
            p95 = times[int(len(times) * 0.95)]
            p99 = times[int(len(times) * 0.99)]
            print(
                f"exact-hit latency, 1 connection, {len(times)} requests: p50 {p50:.3f} ms  p95 {p95:.3f} ms  "
                f"p99 {p99:.3f} ms  (not exact: {misses})"
            )

            out: mp.Queue = mp.Queue()
            start_at = time.time() + 1.0
            procs = [
                mp.Process(
                    target=load_worker, args=(daemon.port, payload, args.conns, args.seconds, args.max_requests, start_at, out)
                )
                for _ in range(args.procs)
            ]
            import psutil

            server = psutil.Process(daemon.proc.pid)
            cpu_before = server.cpu_times()
            for p in procs:
                p.start()
            results = [out.get(timeout=args.seconds + 60) for _ in procs]
            elapsed_end = time.time()
            cpu_after = server.cpu_times()
            for p in procs:
                p.join(10)
            ok = sum(r[0] for r in results)
            bad = sum(r[1] for r in results)
            elapsed = min(args.seconds, elapsed_end - start_at)
            print(
                f"exact-hit throughput, {args.procs} processes x {args.conns} connections, {elapsed:.1f} s: "
                f"{ok / elapsed:,.0f} req/s ({ok} exact hits, {bad} other responses)"
            )
            cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
            if ok:
                print(
                    f"daemon CPU per exact hit: {cpu / ok * 1e6:.0f} µs (one core could serve {ok / cpu:,.0f} req/s); "
                    f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
                )
            with daemon.admin() as admin:
                s = admin.get("/admin/cache/stats").json()
            print(
                f"cache stats: {s['hits']} hits of {s['lookups']} lookups, entries {s['entries']}, hits recorded in SQLite "
                f"{s['hits_recorded']}"
            )
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
