"""Security table row 27: the HTTP edge (Host smuggling, forged X-Forwarded-For, slowloris, deep JSON)
and /metrics behind an admin credential unless metrics_public is on."""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

from tests.daemon import start_daemon

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edge_daemon(tmp_path_factory):
    running = start_daemon(
        tmp_path_factory.mktemp("edge"),
        APPLIANCE_HEADER_TIMEOUT_SECONDS="1.5",
        APPLIANCE_BODY_TIMEOUT_SECONDS="1.5",
        APPLIANCE_MAX_CONNECTIONS="30",
    )
    yield running
    running.stop()


def _chat_body(nesting: int) -> bytes:
    return (
        '{"model":"default","messages":[{"role":"user","content":"hi"}],"response_format":'
        + '{"a":' * nesting
        + "1"
        + "}" * nesting
        + "}"
    ).encode()


@pytest.mark.parametrize("nesting", [100, 10_000, 100_000])
def test_deep_json_is_a_clear_400(daemon, api_key, nesting):
    for body in (_chat_body(nesting), ('{"model":"default","messages":' + "[" * nesting + "]" * nesting + "}").encode()):
        response = httpx.post(
            daemon.url + "/v1/chat/completions",
            content=body,
            timeout=60,
            headers={"Authorization": f"Bearer {api_key}", "content-type": "application/json"},
        )
        assert response.status_code == 400, response.text[:200]
        assert response.json()["error"]["code"] == "json_too_deep"


def test_brackets_inside_strings_do_not_count(daemon, api_key):
    body = {
        "model": "default",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "[" * 300 + "{" * 300 + '\\"' + "]" * 100}],
    }
    response = httpx.post(
        daemon.url + "/v1/chat/completions", json=body, timeout=120, headers={"Authorization": f"Bearer {api_key}"}
    )
    assert response.status_code == 200, response.text[:200]


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:evil",
        "[::1]evil",
        "localhost:",
        "localhost:8080:1",
        "local host",
        "localhost@evil.example",
        "evil.example#localhost",
        "[::1",
        "localhost:99999999",
        "127.0.0.1:99999",
        "127.0.0.1:65536",
        "127.0.0.1:0",
        "127.0.0.1:00000",
        "127.0.0.1:+80",
    ],
)
def test_malformed_host_headers_are_refused(daemon, api_key, host):
    status = _with_host(daemon.port, [host], api_key)
    assert status in (400, 403), (host, status)


def _with_host(port: int, hosts: list[str], key: str) -> int:
    lines = ["GET /v1/models HTTP/1.1", *(f"Host: {h}" for h in hosts), f"Authorization: Bearer {key}", "Connection: close"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = sock.recv(64)
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def test_two_host_headers_are_refused(daemon, api_key):
    assert _with_host(daemon.port, [f"127.0.0.1:{daemon.port}"], api_key) == 200
    assert _with_host(daemon.port, ["evil.example", f"127.0.0.1:{daemon.port}"], api_key) in (400, 403)
    assert _with_host(daemon.port, [f"127.0.0.1:{daemon.port}", "evil.example"], api_key) in (400, 403)


def _failed_sign_in(url: str, forwarded_for: str) -> int:
    """One wrong-password sign-in (with its CSRF token) claiming to come from ``forwarded_for``."""
    headers = {"X-Forwarded-For": forwarded_for}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        form = client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
        return client.post(
            "/login", data={"username": "admin", "password": "wrong-password-xyz", "csrf_token": token}
        ).status_code


def test_forwarded_for_is_not_believed_without_trusted_proxies(tmp_path):
    """A forged X-Forwarded-For must not change the client address the console throttles by."""
    running = start_daemon(tmp_path)
    try:
        assert [_failed_sign_in(running.url, f"203.0.113.{i}") for i in range(3)] == [401, 401, 401]
        # the failures were counted against the real peer, so a fourth claimed address is slowed too
        assert _failed_sign_in(running.url, "198.51.100.7") == 429
    finally:
        running.stop()


def test_forwarded_for_is_believed_from_a_trusted_proxy(tmp_path):
    running = start_daemon(tmp_path, APPLIANCE_TRUSTED_PROXIES='["127.0.0.1"]')
    try:
        assert [_failed_sign_in(running.url, "203.0.113.9") for _ in range(3)] == [401, 401, 401]
        assert _failed_sign_in(running.url, "203.0.113.9") == 429
        # behind a trusted proxy, another forwarded client is another address: not slowed by the first one's failures
        assert _failed_sign_in(running.url, "198.51.100.7") == 401
    finally:
        running.stop()


def test_slow_headers_are_cut_off_and_others_are_served(edge_daemon):
    socks = []
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", edge_daemon.port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(sock)
        assert httpx.get(edge_daemon.url + "/healthz", timeout=5).status_code == 200
        time.sleep(3.0)  # header deadline 1.5 s
        closed = 0
        for sock in socks:
            sock.settimeout(2)
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 0
        assert closed == len(socks)
    finally:
        for sock in socks:
            sock.close()


def test_a_stalled_body_gets_408(edge_daemon):
    with socket.create_connection(("127.0.0.1", edge_daemon.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + edge_daemon.create_key("body").encode()
            + b"\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model":'
        )
        head = sock.recv(64)
        assert head.split()[1] == b"408", head
        assert time.monotonic() - started < 8


def test_connection_cap_refuses_at_once(edge_daemon):
    socks = [socket.create_connection(("127.0.0.1", edge_daemon.port), timeout=10) for _ in range(35)]
    try:
        started = time.monotonic()
        response = httpx.get(edge_daemon.url + "/healthz", timeout=5)
        assert response.status_code == 503
        assert time.monotonic() - started < 2
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 10
    while httpx.get(edge_daemon.url + "/healthz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_metrics_need_an_admin_key(daemon, api_key, admin_key):
    assert httpx.get(daemon.url + "/metrics").status_code == 401
    assert httpx.get(daemon.url + "/metrics", headers={"Authorization": f"Bearer {api_key}"}).status_code == 403
    response = httpx.get(daemon.url + "/metrics", headers={"Authorization": f"Bearer {admin_key}"})
    assert response.status_code == 200 and "appliance_" in response.text


def test_metrics_public_serves_without_a_key(tmp_path):
    running = start_daemon(tmp_path, APPLIANCE_METRICS_PUBLIC="true")
    try:
        assert httpx.get(running.url + "/metrics").status_code == 200
        assert httpx.get(running.url + "/admin/keys").status_code == 401
    finally:
        running.stop()


def test_openapi_document_needs_a_key_and_loads_no_outside_script(daemon, api_key):
    assert httpx.get(daemon.url + "/openapi/openapi.json").status_code == 401
    response = httpx.get(daemon.url + "/openapi/openapi.json", headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200 and "paths" in json.loads(response.text)
    for page in ("/openapi/swagger", "/openapi", "/openapi/elements", "/openapi/redoc"):
        body = httpx.get(daemon.url + page, headers={"Authorization": f"Bearer {api_key}"}).text
        assert "<script" not in body, page


@pytest.mark.parametrize("query", ["scope=key&id=1&id=2", "id=1&i%64=2", "scope=global&scope=key", "scope=global&id=&id=x"])
def test_a_query_parameter_given_twice_is_refused_not_half_read(daemon, admin_key, query):
    """No route takes a list in its query; a repeated name is a 400 naming it, before any handler runs."""
    response = httpx.get(f"{daemon.url}/admin/cache/policy?{query}", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "repeated_query_parameter" and error["param"] in ("id", "scope")
    single = httpx.get(
        f"{daemon.url}/admin/cache/policy?scope=global", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    )
    assert single.status_code == 200, single.text


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/api/generate", {"model": "default", "prompt": "", "options": {"use_mlock": 1}}, "options.use_mlock"),
        ("/api/generate", {"model": "default", "prompt": "hi", "stream": "false"}, "stream"),
        ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}], "stream": 1}, "stream"),
        ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_a_400_naming_it(daemon, api_key, path, body, param):
    """Not coerced and answered as if the client had sent another value (`1` as `true`, `"false"` as `false`)."""
    response = httpx.post(daemon.url + path, json=body, timeout=60, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    if path.startswith("/api/"):  # Ollama's error shape: one string
        assert "Expected" in error and param in error, error
    else:
        assert "Expected" in error["message"] and error["param"] == param, error
