"""Security table row 31: slow bodies, huge headers and piles of anonymous sockets, through the real daemon.

Each test speaks raw HTTP/1.1 over sockets, the way an attacker's script would, and reads what the
daemon wrote back. Deadlines here are a few seconds (configured small), and the checks are on what
happened (status codes, which sockets the daemon closed), never on how fast a busy box was.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from appliance.settings import Settings
from tests.daemon import start_daemon

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def limits_daemon(tmp_path_factory):
    running = start_daemon(
        tmp_path_factory.mktemp("limits"),
        APPLIANCE_BODY_TIMEOUT_SECONDS="3",
        APPLIANCE_HEADER_TIMEOUT_SECONDS="10",
    )
    yield running
    running.stop()


def _status(head: bytes) -> int:
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _read_response(sock: socket.socket) -> int:
    """Read one whole response (head and Content-Length body) off a keep-alive socket; its status."""
    data = _read_head(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return _status(head)


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the daemon closed (or reset) this socket; whatever it wrote first is read and dropped."""
    sock.settimeout(0.05)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_the_defaults_bound_a_whole_request():
    settings = Settings(data_dir="/nonexistent-appliance-dir")
    assert 30 <= settings.body_timeout_seconds <= 60
    assert settings.header_timeout_seconds < settings.body_timeout_seconds
    assert settings.max_header_bytes == 64 * 1024 and settings.max_header_count == 100
    assert settings.anonymous_connections_per_address < settings.max_connections


def test_a_trickled_body_is_closed_with_408_at_the_whole_body_deadline(limits_daemon):
    """One byte every half second never stalls a chunk for long, but the whole body must arrive within 3 s."""
    with socket.create_connection(("127.0.0.1", limits_daemon.port), timeout=30) as sock:
        sock.sendall(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 200\r\n\r\n"
        )
        sent, head = 0, b""
        sock.settimeout(0.5)
        while sent < 60:  # 60 bytes at 2 per second is 30 s: ten times the deadline
            try:
                sock.sendall(b"a")
                sent += 1
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                head = sock.recv(4096)
                break
            except TimeoutError:
                continue
        assert _status(head) == 408, (sent, head[:200])
        assert b'"request_timeout"' in head or b"request_timeout" in head + sock.recv(4096)
        assert sent < 60


def test_a_one_mebibyte_header_gets_431(limits_daemon):
    with socket.create_connection(("127.0.0.1", limits_daemon.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n")
        assert _status(_read_head(sock)) == 431


@pytest.mark.parametrize(
    "headers",
    [
        [b"X-Big: " + b"b" * (70 * 1024)],  # one header past 64 KiB, in one read or several
        [b"X-H%d: %s" % (i, b"c" * 1000) for i in range(80)],  # many headers adding up past 64 KiB
        [b"X-N%d: 1" % i for i in range(150)],  # more than 100 header lines
        [b"X-N: 1"] * 5000,
    ],
    ids=["one-70k", "80x1k", "150-lines", "5000-lines"],
)
def test_header_caps_answer_431(limits_daemon, headers):
    with socket.create_connection(("127.0.0.1", limits_daemon.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n")
        assert _status(_read_head(sock)) == 431


def test_headers_under_the_caps_are_served(limits_daemon):
    with socket.create_connection(("127.0.0.1", limits_daemon.port), timeout=30) as sock:
        extra = b"".join(b"X-H%d: %s\r\n" % (i, b"d" * 500) for i in range(90))  # 90 lines, about 46 KiB
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"Connection: close\r\n\r\n")
        assert _status(_read_head(sock)) == 200


def test_520_slow_anonymous_sockets_leave_healthz_answering(tmp_path):
    """The reported attack: more trickling sign-in bodies from one address than the listener's connection limit.

    The daemon runs with its default limits. Every socket sends its headers and the first byte of a body,
    then stalls. A health probe from the same address must still be answered, and the daemon must hold no
    more of the stalled sockets than the per-address cap."""
    running = start_daemon(tmp_path)
    socks: list[socket.socket] = []
    try:
        for _ in range(520):
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
            sock.sendall(
                b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 100000\r\n\r\nu"
            )
            socks.append(sock)
        for _ in range(3):
            assert httpx.get(running.url + "/healthz", timeout=10).status_code == 200
        time.sleep(1.0)  # let the daemon's closes reach this side
        cap = Settings(data_dir="/nonexistent-appliance-dir").anonymous_connections_per_address
        held = sum(not _closed_by_server(sock) for sock in socks)
        assert held <= cap, held
        assert httpx.get(running.url + "/healthz", timeout=10).status_code == 200
    finally:
        for sock in socks:
            sock.close()
        running.stop()


def test_connections_that_showed_a_key_are_not_counted_as_anonymous(tmp_path):
    """Keyed clients keep their keep-alive connections however many anonymous sockets their address opens."""
    running = start_daemon(tmp_path, APPLIANCE_ANONYMOUS_CONNECTIONS_PER_ADDRESS="4")
    keyed: list[socket.socket] = []
    anonymous: list[socket.socket] = []
    key = running.create_key("keep-alive")
    request = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    try:
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=30)
            sock.sendall(request)
            assert _read_response(sock) == 200
            keyed.append(sock)
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            anonymous.append(sock)
        assert httpx.get(running.url + "/healthz", timeout=10).status_code == 200
        time.sleep(1.0)
        assert sum(_closed_by_server(sock) for sock in anonymous) >= 20 - 4
        for sock in keyed:  # each keyed connection still answers on the same socket
            sock.settimeout(30)
            sock.sendall(request)
            assert _read_response(sock) == 200
    finally:
        for sock in keyed + anonymous:
            sock.close()
        running.stop()


async def _burst(url: str, key: str, n: int) -> list[int | str]:
    """``n`` keyed requests at once from a fresh client: a connection pool's first burst, every connection new."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60, headers=headers) as client:

        async def one() -> int | str:
            try:
                return (await client.get("/v1/models")).status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return list(await asyncio.gather(*(one() for _ in range(n))))


def test_a_pool_opening_more_connections_than_the_cap_at_once_is_named_in_the_log(tmp_path):
    """A pool's first burst opens its connections before any has sent its key, so past the cap the oldest are closed
    like stalled sockets. The admin must be able to tell that from an attack: the log names the address, how many
    were closed and the setting to raise. A burst within the cap is served in full."""
    running = start_daemon(tmp_path, APPLIANCE_ANONYMOUS_CONNECTIONS_PER_ADDRESS="16")
    try:
        key = running.create_key("pool")
        over = asyncio.run(_burst(running.url, key, 40))
        assert over.count(200) >= 16, over
        deadline = time.monotonic() + 10
        while "anonymous_connections_per_address" not in running.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        line = next(x for x in running.log().splitlines() if "anonymous_connections_per_address" in x)
        assert "from 127.0.0.1 " in line and "more than 16 " in line, line
        assert asyncio.run(_burst(running.url, key, 16)) == [200] * 16
    finally:
        running.stop()


@pytest.mark.parametrize("target", ["http://evil.example/v1/models", "http://evil.example:{port}/v1/models"])
def test_an_absolute_form_target_for_another_host_is_refused(daemon, api_key, target):
    line = target.format(port=daemon.port)
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(
            f"GET {line} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nAuthorization: Bearer {api_key}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        assert _status(_read_head(sock)) in (400, 403)


def test_an_absolute_form_target_for_this_host_is_served(daemon, api_key):
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(
            f"GET http://127.0.0.1:{daemon.port}/v1/models HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
            f"Authorization: Bearer {api_key}\r\nConnection: close\r\n\r\n".encode()
        )
        assert _status(_read_head(sock)) == 200


def test_a_trusted_proxy_is_not_capped_as_one_anonymous_client(tmp_path):
    """Behind a reverse proxy every client shares the proxy's address: its connections are not evicted."""
    running = start_daemon(tmp_path, APPLIANCE_ANONYMOUS_CONNECTIONS_PER_ADDRESS="4", APPLIANCE_TRUSTED_PROXIES='["127.0.0.1"]')
    socks: list[socket.socket] = []
    try:
        for _ in range(12):
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(sock)
        assert httpx.get(running.url + "/healthz", timeout=10).status_code == 200
        time.sleep(1.0)
        assert sum(_closed_by_server(sock) for sock in socks) == 0
    finally:
        for sock in socks:
            sock.close()
        running.stop()
