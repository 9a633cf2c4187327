"""Security table rows 32 and 16: where sign-in sends the browser, and the CSRF origin check, through the real daemon.

``next`` spellings that browsers read as another origin (a tab or newline they drop, a backslash they
read as a slash, a full-width dot, a scheme) must land on ``/``; none may cost a 500 or a closed
connection. An ``Origin`` of another scheme, host or port is refused even with a valid CSRF token.
"""

from __future__ import annotations

import html
import re
import socket
from urllib.parse import quote

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

PASSWORD = "redirect-test-passphrase-41"


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("redirect"))
    with running.admin() as admin:
        r = admin.post("/admin/users/", json={"username": "redirector", "password": PASSWORD, "role": "viewer"})
        assert r.status_code in (200, 201), r.text
    yield running
    running.stop()


def _form(client: httpx.Client, query: str = "") -> tuple[str, str]:
    """The sign-in form's CSRF token and its hidden ``next`` value."""
    page = client.get("/login" + query)
    assert page.status_code == 200, page.text[:300]
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    next_value = re.search(r'name="next" value="([^"]*)"', page.text).group(1)
    return token, html.unescape(next_value)


# What a browser's address bar would turn into another origin, as the query string carries it.
SPELLINGS = [
    "/%09/evil.com",
    "/%5C/evil",
    "/%E3%80%82/x",
    "/%0a/evil.com",
    "%0a",
    "//evil.com",
    "https://evil.com",
    "/%20/evil.com",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_sign_in_form_keeps_only_a_local_path(console_daemon: RunningDaemon, spelling: str) -> None:
    with httpx.Client(base_url=console_daemon.url, timeout=30) as client:
        _, next_value = _form(client, "?next=" + spelling)
        assert next_value == "/", next_value


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_signing_in_never_redirects_off_site(console_daemon: RunningDaemon, spelling: str) -> None:
    """The ``next`` field as posted (the form could be forged): the answer is a 303 to ``/``."""
    raw_next = spelling.replace("%0a", "%0A")
    body = f"username=redirector&password={quote(PASSWORD)}&next={raw_next}"
    with httpx.Client(base_url=console_daemon.url, timeout=30) as client:
        token, _ = _form(client)
        response = client.post(
            "/login",
            content=f"{body}&csrf_token={quote(token)}",
            headers={"content-type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
    assert response.status_code == 303, response.text[:300]
    assert response.headers["location"] == "/", response.headers["location"]


def test_a_local_next_is_kept(console_daemon: RunningDaemon) -> None:
    with httpx.Client(base_url=console_daemon.url, timeout=30) as client:
        token, next_value = _form(client, "?next=/usage%3Fdays%3D7")
        assert next_value == "/usage?days=7"
        response = client.post(
            "/login",
            data={"username": "redirector", "password": PASSWORD, "next": next_value, "csrf_token": token},
            follow_redirects=False,
        )
    assert response.status_code == 303 and response.headers["location"] == "/usage?days=7"


def test_a_non_ascii_next_on_the_raw_socket_is_not_a_500(console_daemon: RunningDaemon) -> None:
    """Bytes a browser would never send unencoded, straight on the request line."""
    with socket.create_connection(("127.0.0.1", console_daemon.port), timeout=30) as sock:
        sock.sendall(b"GET /login?next=/\xe3\x80\x82/x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        head = sock.recv(64)
    assert head.startswith(b"HTTP/1.1 ") and int(head.split()[1]) < 500, head


@pytest.mark.parametrize(
    "origin, allowed",
    [
        ("http://127.0.0.1:{port}", True),
        ("https://127.0.0.1:{port}", False),  # another scheme: another origin
        ("http://127.0.0.1:1{port}", False),
        ("http://127.0.0.1", False),  # port 80
        ("http://evil.example:{port}", False),
        ("HTTP://127.0.0.1:{port}", True),  # scheme and host compare without case
    ],
)
def test_the_csrf_origin_check_compares_scheme_host_and_port(console_daemon: RunningDaemon, origin: str, allowed: bool) -> None:
    with httpx.Client(base_url=console_daemon.url, timeout=30) as client:
        token, _ = _form(client)
        response = client.post(
            "/login",
            data={"username": "redirector", "password": "a-wrong-one", "csrf_token": token},
            headers={"Origin": origin.format(port=console_daemon.port)},
            follow_redirects=False,
        )
    if allowed:
        assert response.status_code == 401, response.text[:300]  # past the CSRF check, to the password check
    else:
        assert response.status_code == 403, response.text[:300]
