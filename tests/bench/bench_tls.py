"""What HTTPS costs the daemon: a new connection's handshake, and a request on a kept-alive connection.

Two real daemons on this box serve the same tiny model from a read-only store, one with ``tls = "off"``, one with
``tls = "self-signed"``. Rounds alternate between them (a busy 2-core box drifts; compare only inside one run):

- new connection: connect, TLS handshake (session resumption off: each one is a full handshake), ``GET /healthz``,
  close; the median of each round is shown, and the daemon's CPU time per connection over the round.
- kept alive: ``GET /healthz`` on one open connection, after a warm-up; the median per round.

    python tests/bench/bench_tls.py [--requests 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.daemon import RunningDaemon  # noqa: E402
from tests.tlskit import TlsDaemon, tls_daemon_env  # noqa: E402

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _read_response(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)


def _connect(port: int, context: ssl.SSLContext | None) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return context.wrap_socket(raw, server_hostname="localhost") if context else raw


def new_connections(port: int, context: ssl.SSLContext | None, n: int, pid: int) -> tuple[float, float]:
    """(median ms per connect+handshake+request, daemon CPU ms per connection)."""
    proc = psutil.Process(pid)
    cpu0 = sum(proc.cpu_times()[:2])
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn = _connect(port, context)
        conn.sendall(REQUEST)
        _read_response(conn)
        times.append(time.perf_counter() - start)
        conn.close()
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    return statistics.median(times) * 1000, cpu / n * 1000


def kept_alive(port: int, context: ssl.SSLContext | None, n: int) -> float:
    conn = _connect(port, context)
    for _ in range(10):
        conn.sendall(REQUEST)
        _read_response(conn)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.sendall(REQUEST)
        _read_response(conn)
        times.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        data, port, env = tls_daemon_env(base / "plain", APPLIANCE_TLS="off")
        plain = RunningDaemon(data, port, env)
        plain.start()
        data, port, env = tls_daemon_env(base / "tls")
        tls = TlsDaemon(data, port, env).start()
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.options |= ssl.OP_NO_TICKET  # no resumption: every connection pays the full handshake
        rows: dict[str, list[tuple[float, float, float]]] = {"http": [], "https": []}
        try:
            for _ in range(args.rounds):
                for name, daemon, ctx in (("http", plain, None), ("https", tls, context)):
                    assert daemon.proc is not None
                    fresh, cpu = new_connections(daemon.port, ctx, args.requests, daemon.proc.pid)
                    rows[name].append((fresh, cpu, kept_alive(daemon.port, ctx, args.requests)))
        finally:
            plain.stop()
            tls.stop()
    print(f"{args.requests} requests per round, {args.rounds} rounds, GET /healthz, TLS {ssl.OPENSSL_VERSION}")
    print("| listener | new connection, median ms | daemon CPU ms per connection | kept alive, median ms |")
    print("|---|---|---|---|")
    for name, values in rows.items():
        cells = [" / ".join(f"{v[i]:.2f}" for v in values) for i in range(3)]
        print(f"| {name} | {cells[0]} | {cells[1]} | {cells[2]} |")


if __name__ == "__main__":
    main()
