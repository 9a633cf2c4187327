"""/docs, the manual served by the daemon: who may read it, which files it may answer, and its CSP.

The manual holds no secret, but the rule of the box holds (security table, row 1): without a
credential a browser is sent to sign in and nothing is served; a wrong key is 401. No spelling of a
path answers a file outside the built site (row 4), and a page loads nothing from off the box.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from appliance.manual.site import script_hashes
from tests.daemon import RunningDaemon, start_daemon
from tests.manualkit import ROOT, ensure_installed_site, off_box_references

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    ensure_installed_site()
    running = start_daemon(tmp_path_factory.mktemp("manual"))
    engine = make_engine(running.data_dir / "appliance.db")
    create_user(engine, "vera", "vera-password-1", role="viewer")
    engine.dispose()
    running.reader_key = running.create_key("manual-reader")
    yield running
    running.stop()


def _raw_get(daemon: RunningDaemon, target: str, key: str) -> tuple[int, bytes]:
    """A GET with the path exactly as written: no client normalises it on the way."""
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(request.encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _sign_in(daemon: RunningDaemon, username: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=daemon.url, timeout=60)
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    client.post("/login", data={"username": username, "password": password, "csrf_token": token})
    return client


def test_without_a_credential_nothing_is_served_and_a_browser_is_sent_to_sign_in(box: RunningDaemon):
    for path in ("/docs", "/docs/", "/docs/install.html", "/docs/assets/javascripts/", "/docs/search/search_index.json"):
        response = httpx.get(box.url + path, timeout=30)
        assert response.status_code == 303, (path, response.status_code)
        assert response.headers["location"].startswith("/login?next=/docs")
        assert b"Install and operate" not in response.content
    for header in ({"Authorization": "Bearer ak_wrong"}, {"x-api-key": "ak_wrong"}, {"Authorization": "Basic dXNlcjpwYXNz"}):
        response = httpx.get(box.url + "/docs/install.html", headers=header, timeout=30)
        assert response.status_code == 401, (header, response.status_code)
        assert b"Install and operate" not in response.content


def test_a_key_or_a_console_session_reads_the_manual(box: RunningDaemon):
    with box.client(box.reader_key) as client:
        root = client.get("/docs")
        assert root.status_code == 308 and root.headers["location"] == "/docs/"
        index = client.get("/docs/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        assert "Install and operate" in index.text
        page = httpx.get(box.url + "/docs/configuration-reference.html", headers={"x-api-key": box.reader_key}, timeout=30)
        assert page.status_code == 200 and "APPLIANCE_DATA_DIR" in page.text
    viewer = _sign_in(box, "vera", "vera-password-1")
    try:
        response = viewer.get("/docs/security.html")
        assert response.status_code == 200 and "Security model" in response.text
    finally:
        viewer.close()


def test_pages_and_assets_carry_their_type_and_a_strict_policy(box: RunningDaemon):
    with box.client(box.reader_key) as client:
        index = client.get("/docs/")
        stylesheets = re.findall(r'href="(assets/stylesheets/[^"]+\.css)"', index.text)
        scripts = re.findall(r'src="(assets/javascripts/[^"]+\.js)"', index.text)
        assert stylesheets and scripts
        for path, kind in [(stylesheets[0], "text/css"), (scripts[0], "text/javascript")]:
            asset = client.get("/docs/" + path)
            assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind), path
            assert asset.headers["x-content-type-options"] == "nosniff"
        assert off_box_references(client.get("/docs/" + stylesheets[0]).text) == []
        policy = index.headers["content-security-policy"]
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        allowed = re.search(r"script-src ([^;]+)", policy).group(1).split()
        assert allowed[0] == "'self'" and set(allowed[1:]) == set(script_hashes(index.content))
        assert re.search(r"(?:^|; )default-src 'self'(?:;|$)", policy) and "frame-ancestors 'none'" in policy
        assert index.headers["x-frame-options"] == "DENY"
        for name in ("index", "install", "api", "benchmarks", "configuration-reference"):
            html = client.get(f"/docs/{name}.html").text
            assert off_box_references(html) == [], name


SECRET = ROOT / "pyproject.toml"  # a file just outside the site: webui/manual/../../pyproject.toml


@pytest.mark.parametrize(
    "target",
    [
        "/docs/../../pyproject.toml",
        "/docs/../../../../../../etc/passwd",
        "/docs/%2e%2e/%2e%2e/pyproject.toml",
        "/docs/%2E%2E%2F%2E%2E%2Fpyproject.toml",
        "/docs/..%2f..%2fpyproject.toml",
        "/docs/..%5c..%5cpyproject.toml",
        "/docs/..\\..\\pyproject.toml",
        "/docs/assets/../../../pyproject.toml",
        "/docs/.%2e/.%2e/pyproject.toml",
        "/docs/%252e%252e/%252e%252e/pyproject.toml",
        "/docs//etc/passwd",
        "/docs/%2fetc%2fpasswd",
        "/docs/..;/..;/pyproject.toml",
        "/docs/index.html%00.css",
        "/docs/%c0%ae%c0%ae/%c0%ae%c0%ae/pyproject.toml",
        "/docs/./../../pyproject.toml",
        "/DOCS/../../pyproject.toml",
    ],
)
def test_no_path_spelling_reads_outside_the_site(box: RunningDaemon, target: str):
    status, body = _raw_get(box, target, box.reader_key)
    assert 400 <= status < 500, (target, status)
    assert b"[project]" not in body and b"root:x:0:0" not in body
    assert SECRET.read_bytes()[:200] not in body


def test_the_site_is_the_built_one(box: RunningDaemon):
    """What /docs answers is the mkdocs build of docs/ (the same file, byte for byte)."""
    site = ensure_installed_site()
    with box.client(box.reader_key) as client:
        for relative in ("index.html", "search/search_index.json"):
            assert client.get("/docs/" + relative).content == (site / Path(relative)).read_bytes()
