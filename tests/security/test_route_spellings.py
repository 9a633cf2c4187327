"""Security table row 21: no spelling of a path reaches a handler without its credential.

Every route of the app (taken from the app itself, with the access level each
route declares) is asked for in seven spellings that routers and prefix checks
tend to read differently, at each credential level below the one it needs,
over a raw socket so that no client library normalises the path first. None
may answer 2xx. A Hypothesis fuzzer then mixes the same tricks at random into
the paths and headers of real routes.
"""

from __future__ import annotations

import re
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.api.access import ACCESS, Access
from appliance.app import create_app
from appliance.settings import Settings

pytestmark = pytest.mark.slow


def _concrete(path: str) -> str:
    path = re.sub(r"\{[^}:]+:int\}", "1", path)
    return re.sub(r"\{[^}]+\}", "x", path)


def declared_routes() -> list[tuple[str, str, Access, bool]]:
    """(method, path, access level, public console page) for every handler of the app."""
    app = create_app(Settings(data_dir="/nonexistent-appliance-routes", seed_default_model=False))
    out = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            level = handler.opt.get(ACCESS)
            public_page = bool(handler.opt.get("public"))
            for method in sorted(set(handler.http_methods) - {"OPTIONS", "HEAD"}):
                out.append((method, _concrete(route.path), level, public_page))
    return out


def test_every_route_declares_its_access_level():
    missing = [(m, p) for m, p, level, _ in declared_routes() if not isinstance(level, Access)]
    assert not missing
    levels = {p.rstrip("/") or "/": level for _, p, level, _ in declared_routes()}
    assert levels["/admin/keys"] is Access.ADMIN and levels["/v1/chat/completions"] is Access.KEY
    assert levels["/metrics"] is Access.METRICS and levels["/healthz"] is Access.PUBLIC
    assert levels["/api/chat"] is Access.KEY and levels["/api/pull"] is Access.ADMIN and levels["/api/delete"] is Access.ADMIN


def test_the_only_public_console_pages_are_the_sign_in_ones():
    """Sign-in with a password and the two legs of single sign-on; nothing else skips the console's session."""
    public = {(m, p) for m, p, _level, public_page in declared_routes() if public_page}
    assert public == {("GET", "/login"), ("POST", "/login"), ("GET", "/login/oidc"), ("GET", "/login/oidc/callback")}


def spellings(path: str) -> list[str]:
    """The path in the spellings a router may normalise and a prefix check may not."""
    bare = path.lstrip("/")
    return [
        "/" + path if path.startswith("/") else "//" + bare,  # //x
        "/%2F" + bare,  # /%2Fx
        "/./" + bare,  # /./x
        "/" + bare.upper(),  # /X
        path.rstrip("/") + "/",  # x/
        path + ";a=b",  # x;a=b
        path + "%00",  # x%00
        "/" + bare.replace("/", "//"),  # every separator doubled
        "/" + bare.replace("/", "%2f"),
    ]


def raw_request(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"{}",
    extra_lines: list[str] | None = None,
) -> int:
    """Send one request exactly as written; returns the status code (0 if the server closed without one)."""
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()] + (extra_lines or [])
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n" not in received:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    return int(match.group(1)) if match else 0


def _credentials_below(level: Access, user_key: str) -> list[tuple[str, dict[str, str]]]:
    """The credential levels that must not be enough for a route of ``level``."""
    if level in (Access.PUBLIC,):
        return []
    if level in (Access.KEY, Access.CONSOLE):
        return [("none", {})]
    return [("none", {}), ("user key", {"Authorization": f"Bearer {user_key}"})]


def test_no_spelling_reaches_a_handler_without_its_credential(daemon, api_key):
    failures = []
    checked = 0
    for method, path, level, public_page in declared_routes():
        if public_page or path.startswith("/static"):
            continue
        for who, headers in _credentials_below(level, api_key):
            for target in [path, *spellings(path)]:
                status = raw_request(daemon.port, method, target, headers)
                checked += 1
                if 200 <= status < 300 or status == 0 or status >= 500:
                    failures.append((method, target, who, status))
    assert checked > 500
    assert not failures, failures[:20]


def test_non_canonical_paths_are_refused_before_routing(daemon, admin_key):
    """Even with the right credential, a path that would need normalising is refused, not guessed."""
    auth = {"Authorization": f"Bearer {admin_key}"}
    assert raw_request(daemon.port, "GET", "/admin/keys", auth) == 200
    for target in (
        "//admin/keys",
        "/%2Fadmin/keys",
        "/./admin/keys",
        "/admin/../admin/keys",
        "/admin/keys%00",
        "/admin/keys;a=b",
        "/admin%2fkeys",
        "/admin/%2e%2e/admin/keys",
        "/admin\\keys",
        "/admin/keys%252f",
    ):
        assert raw_request(daemon.port, "GET", target, auth) == 400, target


def test_admin_route_creates_no_key_without_credential(daemon):
    """The reported attack: POST //admin/keys with no credential created an admin key (201)."""
    body = b'{"name":"x","role":"admin"}'
    for target in ("//admin/keys", "/%2Fadmin/keys", "/admin/keys/", "/admin/keys"):
        status = raw_request(daemon.port, "POST", target, body=body)
        assert status in (400, 401), (target, status)
    for target in ("//metrics", "//openapi/openapi.json", "//admin/usage", "/metrics", "/openapi/openapi.json"):
        assert raw_request(daemon.port, "GET", target) in (400, 401), target


_ROUTES = None


def _fuzz_routes() -> list[tuple[str, str, Access]]:
    global _ROUTES
    if _ROUTES is None:
        _ROUTES = [
            (m, p, level) for m, p, level, public in declared_routes() if level in (Access.ADMIN, Access.METRICS) and not public
        ]
    return _ROUTES


_TRICKS = ["/", "//", "/./", "%2F", "%2f", "%2e", ".", "..", ";", "%00", "%20", "%25", "\\", "~", "?", "#", "%3B", "A"]


@st.composite
def mangled(draw: st.DrawFn) -> tuple[str, str]:
    method, path, _ = draw(st.sampled_from(_fuzz_routes()))
    chars = list(path)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(chars)))
        chars.insert(at, draw(st.sampled_from(_TRICKS)))
    if draw(st.booleans()):
        chars = [c.upper() if draw(st.booleans()) else c for c in chars]
    target = "".join(chars)
    if not target.startswith("/"):
        target = "/" + target
    return method, target


@st.composite
def hostile_headers(draw: st.DrawFn) -> list[str]:
    options = [
        "X-Forwarded-For: 127.0.0.1",
        "X-Forwarded-Host: localhost",
        "X-Original-URL: /admin/keys",
        "X-Rewrite-URL: /admin/keys",
        "Authorization: Bearer ",
        "Authorization: Basic YWRtaW46YWRtaW4=",
        "x-api-key: ak_",
        "Authorization: Bearer ak_" + "A" * 40,
        "Host: localhost",
    ]
    return draw(st.lists(st.sampled_from(options), max_size=3, unique=True))


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(request=mangled(), extra=hostile_headers())
def test_fuzzed_paths_and_headers_never_reach_admin_handlers(daemon, request, extra):
    method, target = request
    target = target.replace("#", "%23")
    status = raw_request(daemon.port, method, target, extra_lines=extra)
    assert 0 < status < 500, (method, target, extra, status)
    assert not (200 <= status < 300), (method, target, extra, status)
