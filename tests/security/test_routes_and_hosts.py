"""reliability-table rows 1 (open routes), 2 (DNS rebinding), 8 (SQL injection at key lookup), 11 (revocation).

The Anthropic Messages API's own credential, ``x-api-key``, goes through the same
hashed lookup: missing, wrong, injected, revoked and expired keys are refused on
/v1/messages with Anthropic's error shape.
"""

import re
import statistics
import time

import httpx
import pytest

from appliance.api.access import ACCESS, Access
from appliance.app import create_app
from appliance.settings import Settings

pytestmark = pytest.mark.slow

OPEN = {"/healthz", "/readyz"}


def _concrete(path: str) -> str:
    """A path with its parameters filled with values of the right type."""
    path = re.sub(r"\{[^}:]+:int\}", "1", path)
    return re.sub(r"\{[^}]+\}", "x", path)


def app_routes() -> list[tuple[str, str]]:
    """Every (method, path) the app serves, taken from the app itself."""
    app = create_app(Settings(data_dir="/nonexistent-appliance-routes", seed_default_model=False))
    routes = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", {"GET"}) - {"OPTIONS", "HEAD"}):
            routes.append((method, _concrete(route.path)))
    return routes


def test_route_list_is_not_empty():
    paths = {p for _, p in app_routes()}
    assert {"/v1/chat/completions", "/v1/models", "/admin/keys", "/api/chat", "/api/pull"} <= {p.rstrip("/") for p in paths}


def admin_routes() -> set[tuple[str, str]]:
    """Every (method, path) whose handler declares the admin level, taken from the app itself."""
    app = create_app(Settings(data_dir="/nonexistent-appliance-routes", seed_default_model=False))
    return {
        (method, _concrete(route.path))
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if handler.opt.get(ACCESS) is Access.ADMIN
        for method in set(handler.http_methods) - {"OPTIONS", "HEAD"}
    }


def test_every_route_needs_credentials(daemon):
    failures = []
    for method, path in app_routes():
        if path in OPEN or path.startswith("/static"):
            continue
        response = httpx.request(method, daemon.url + path, timeout=30, follow_redirects=False)
        console_redirect = response.status_code in (302, 303) and "/login" in response.headers.get("location", "")
        is_login_page = path.rstrip("/") in ("/login",)
        if not (response.status_code == 401 or console_redirect or is_login_page or (path.startswith(("/login", "/static")))):
            failures.append((method, path, response.status_code))
    assert not failures


def test_user_key_gets_403_on_admin_routes(daemon, api_key):
    failures = []
    admin = admin_routes()
    assert {("POST", "/api/pull"), ("DELETE", "/api/delete")} <= admin
    for method, path in app_routes():
        if not path.startswith("/admin") and (method, path) not in admin:
            continue
        response = httpx.request(method, daemon.url + path, headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
        if response.status_code != 403:
            failures.append((method, path, response.status_code))
    assert not failures


@pytest.mark.parametrize("host", ["evil.example", "", ":8080", "evil.example:8080", "127.0.0.1.evil.example"])
def test_dns_rebinding_hosts_are_refused(daemon, api_key, host):
    for path in ("/v1/models", "/", "/login"):
        with httpx.Client() as client:
            request = client.build_request("GET", daemon.url + path, headers={"Authorization": f"Bearer {api_key}"})
            request.headers["host"] = host
            response = client.send(request)
        assert response.status_code == 403, (host, path, response.status_code)


def test_allowed_hosts_pass(daemon, api_key):
    for host in (f"127.0.0.1:{daemon.port}", f"localhost:{daemon.port}"):
        response = httpx.get(daemon.url + "/v1/models", headers={"Authorization": f"Bearer {api_key}", "Host": host})
        assert response.status_code == 200


INJECTIONS = [
    "' OR '1'='1",
    "ak_' OR '1'='1",
    "ak_x' UNION SELECT secret_hash FROM api_keys--",
    "ak_1' AND (SELECT 1 FROM (SELECT(SLEEP(5)))a)--",
    "ak_'; SELECT randomblob(1000000000);--",
    "ak_" + "A" * 10_000,
    "ak_abc\x00def",
]


def _timed(url: str, token: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        response = httpx.get(url, headers={"Authorization": "Bearer " + token}, timeout=10)
        status = response.status_code
    except (httpx.LocalProtocolError, ValueError):
        status = 400  # the client itself refuses to send a NUL in a header
    return status, time.perf_counter() - started


def test_sql_injection_tokens_are_401_at_normal_latency(daemon):
    url = daemon.url + "/v1/models"
    baseline = statistics.median(_timed(url, "ak_ordinary-wrong-key")[1] for _ in range(5))
    for token in INJECTIONS:
        status, seconds = _timed(url, token)
        assert status in (400, 401), (token[:40], status)
        assert seconds < baseline + 0.5, (token[:40], seconds)
    with httpx.Client() as client:  # x-api-key path too
        assert client.get(url, headers={"x-api-key": "' OR 1=1 --"}).status_code == 401


def test_revoked_key_fails_on_the_very_next_request(daemon):
    key = daemon.create_key("to-revoke")
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(daemon.url + "/v1/models", headers=headers).status_code == 200
    with daemon.admin() as admin:
        admin.delete(f"/admin/keys/{key[:12]}").raise_for_status()
    assert httpx.get(daemon.url + "/v1/models", headers=headers).status_code == 401


def test_expired_key_is_refused(daemon):
    key = daemon.create_key("expiring", expires_in_days=1 / 86400 / 10)  # 0.1 s
    time.sleep(0.3)
    response = httpx.get(daemon.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 401


MESSAGE = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}


def _anthropic_401(response: httpx.Response) -> None:
    assert response.status_code == 401, (response.status_code, response.text[:200])
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == "authentication_error" and body["error"]["message"], body


def test_messages_api_x_api_key_missing_wrong_revoked_expired_are_401_in_anthropic_shape(daemon):
    key = daemon.create_key("x-api-key")
    routes = [("/v1/messages", MESSAGE), ("/v1/messages/count_tokens", {k: MESSAGE[k] for k in ("model", "messages")})]
    with httpx.Client(base_url=daemon.url, timeout=300) as client:
        for path, body in routes:
            assert client.post(path, json=body, headers={"x-api-key": key, **ANTHROPIC_VERSION}).status_code == 200
            for headers in (
                {},
                {"x-api-key": ""},
                {"x-api-key": "ak_ordinary-wrong-key"},
                {"x-api-key": "' OR '1'='1"},
                {"x-api-key": "ak_x' UNION SELECT secret_hash FROM api_keys--"},
                {"x-api-key": "ak_" + "A" * 10_000},
                {"x-api-key": key[:-1]},
                {"Authorization": "Basic " + key, "x-api-key": key},
            ):
                _anthropic_401(client.post(path, json=body, headers={**headers, **ANTHROPIC_VERSION}))
        with daemon.admin() as admin:
            admin.delete(f"/admin/keys/{key[:12]}").raise_for_status()
        for path, body in routes:
            _anthropic_401(client.post(path, json=body, headers={"x-api-key": key, **ANTHROPIC_VERSION}))
        expiring = daemon.create_key("x-api-key-expiring", expires_in_days=1 / 86400 / 10)  # 0.1 s
        time.sleep(0.3)
        _anthropic_401(client.post("/v1/messages", json=MESSAGE, headers={"x-api-key": expiring, **ANTHROPIC_VERSION}))


def test_messages_api_model_outside_the_allow_list_is_403_in_anthropic_shape(daemon):
    key = daemon.create_key("x-api-key-limited", allowed_models=["some-other-model"])
    response = httpx.post(daemon.url + "/v1/messages", json=MESSAGE, headers={"x-api-key": key, **ANTHROPIC_VERSION}, timeout=60)
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error" and response.json()["type"] == "error"
