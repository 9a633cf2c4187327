"""The HTTP edge under the two anonymous attacks of security row 31, with figures.

Starts the real daemon with its default limits and prints:

- ``/healthz`` requests per second on one keep-alive connection (what the edge costs each request);
- ``/healthz`` latency (median, max of 50 sequential probes) on a quiet listener, then while
  ``--sockets`` connections from the same address trickle sign-in bodies, and how many of those
  sockets the daemon still holds (at most ``anonymous_connections_per_address``);
- the daemon's resident memory before and after ``--floods`` connections each send
  ``--flood-mib`` MiB of one header, and the statuses they got.

Usage: ``.venv/bin/python tests/bench/bench_edge_attack.py [--sockets 520] [--floods 40] [--flood-mib 15]``
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.daemon import start_daemon  # noqa: E402

TRICKLE = (
    b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 100000\r\n\r\nu"
)


def probe(port: int, n: int = 50) -> tuple[float, float, int]:
    """Median and max latency in ms of ``n`` /healthz probes, each on a new connection, and how many were not 200."""
    times, failed = [], 0
    for _ in range(n):
        started = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                ok = sock.recv(12) == b"HTTP/1.1 200"
        except OSError:
            ok = False
        times.append((time.perf_counter() - started) * 1000)
        failed += not ok
    return statistics.median(times), max(times), failed


def keepalive_rate(port: int, n: int = 2000) -> float:
    """/healthz requests per second, one after another on one keep-alive connection (the edge's per-request cost)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.perf_counter()
        for _ in range(n):
            sock.sendall(request)
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                data += sock.recv(4096)
        return n / (time.perf_counter() - started)


def held(socks: list[socket.socket]) -> int:
    count = 0
    for sock in socks:
        sock.settimeout(0.01)
        try:
            count += sock.recv(65536) != b""
        except TimeoutError:
            count += 1
        except OSError:
            pass
    return count


def flood(port: int, mib: int, statuses: list[bytes]) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
            chunk = b"f" * (1024 * 1024)
            for _ in range(mib):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
            statuses.append(sock.recv(12))
    except OSError as exc:
        statuses.append(type(exc).__name__.encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sockets", type=int, default=520)
    parser.add_argument("--floods", type=int, default=40)
    parser.add_argument("--flood-mib", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        running = start_daemon(Path(tmp))
        try:
            daemon = psutil.Process(running.proc.pid)
            rates = [keepalive_rate(running.port) for _ in range(3)]
            print(f"keep-alive:       /healthz {statistics.median(rates):.0f} requests/s (median of 3 x 2000)")
            med, worst, failed = probe(running.port)
            print(f"quiet:            /healthz median {med:.1f} ms, max {worst:.1f} ms, not 200: {failed}/50")
            socks = []
            for _ in range(args.sockets):
                sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
                sock.sendall(TRICKLE)
                socks.append(sock)
            med, worst, failed = probe(running.port)
            time.sleep(0.5)
            print(
                f"{args.sockets} trickling: /healthz median {med:.1f} ms, max {worst:.1f} ms, not 200: {failed}/50; "
                f"sockets the daemon still holds: {held(socks)}"
            )
            for sock in socks:
                sock.close()
            time.sleep(1.0)
            rss_before = daemon.memory_info().rss
            statuses: list[bytes] = []
            threads = [threading.Thread(target=flood, args=(running.port, args.flood_mib, statuses)) for _ in range(args.floods)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rss_after = daemon.memory_info().rss
            kinds = {s.decode(errors="replace"): statuses.count(s) for s in set(statuses)}
            print(
                f"{args.floods} x {args.flood_mib} MiB headers: RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB "
                f"({(rss_after - rss_before) / 2**20:+.0f} MiB); answers {kinds}"
            )
        finally:
            running.stop()


if __name__ == "__main__":
    main()
