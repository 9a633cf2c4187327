"""The console in-process (reliability-table row 16): sign-in, sessions, CSRF, roles, headers, throttling.

The app runs over a migrated database with services that were never started (no
store, router, meter or cache), which is also how the console must degrade:
every page still renders.
"""

from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient

from appliance.accounts.users import create_user
from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.services import Services
from appliance.settings import Settings

PASSWORDS = {"alice": "alice-password-1", "otto": "otto-password-1", "victor": "victor-password-1"}
PAGES = [
    "/",
    "/overview/live",
    "/models",
    "/keys",
    "/usage",
    "/alerts",
    "/cache",
    "/prices",
    "/aliases",
    "/settings",
    "/audit",
    "/password",
]


@pytest.fixture
def app(tmp_path):
    settings = Settings(data_dir=tmp_path, seed_default_model=False)
    dbmod.migrate(settings.db_path)
    services = Services(settings)
    for name, role in (("alice", "admin"), ("otto", "operator"), ("victor", "viewer")):
        create_user(services.db, name, PASSWORDS[name], role=role)
    yield create_app(settings, services=services)
    services.db.dispose()


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html) or re.search(r'"X-CSRF-Token": "([^"]+)"', html)
    assert match, html[:500]
    return match.group(1)


def sign_in(client: TestClient, user: str, password: str | None = None):
    token = _csrf(client.get("/login").text)
    return client.post(
        "/login", data={"username": user, "password": password or PASSWORDS[user], "csrf_token": token}, follow_redirects=False
    )


def signed_in(app, user: str, base_url: str = "http://testserver.local") -> TestClient:
    client = TestClient(app, base_url=base_url)
    client.__enter__()
    assert sign_in(client, user).status_code == 303
    return client


def test_signed_out_visitors_are_sent_to_login(app):
    with TestClient(app) as client:
        for path in PAGES + ["/playground", "/users"]:
            response = client.get(path, follow_redirects=False)
            assert response.status_code == 303 and response.headers["location"].startswith("/login"), path
        response = client.get("/keys", headers={"HX-Request": "true"}, follow_redirects=False)
        assert response.headers.get("hx-redirect") == "/login"
        response = client.post("/keys/create", data={"name": "x"}, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/login"


def test_every_page_renders_without_the_services_running(app):
    client = signed_in(app, "alice")
    for path in PAGES + ["/playground", "/users", "/usage?range=7d", "/usage.csv?by=model&range=7d"]:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
    client.__exit__(None, None, None)


def test_session_cookie_flags_and_security_headers(app):
    with TestClient(app, base_url="https://appliance.example") as client:
        response = sign_in(client, "alice")
        cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith("appliance_session="))
        flags = [f.strip().lower() for f in cookie.split(";")]
        assert "httponly" in flags and "samesite=strict" in flags and "secure" in flags and "path=/" in flags
        page = client.get("/")
    csp = page.headers["content-security-policy"]
    assert "unsafe-eval" not in csp and "unsafe-inline" not in csp
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    assert (
        'name="htmx-config"' in page.text and '"allowEval":false' in page.text and '"includeIndicatorStyles":false' in page.text
    )
    assert "<script>" not in page.text and " on" + "click=" not in page.text  # no inline script, no inline handlers
    with TestClient(app, base_url="http://appliance.example") as client:
        cookie = next(c for c in sign_in(client, "alice").headers.get_list("set-cookie") if c.startswith("appliance_session="))
        assert "secure" not in cookie.lower()


def test_unsafe_requests_need_the_csrf_token(app):
    client = signed_in(app, "alice")
    token = _csrf(client.get("/keys").text)
    assert client.post("/teams/create", data={"name": "no-token"}).status_code == 403
    assert client.post("/teams/create", data={"name": "bad", "csrf_token": "x" * 43}).status_code == 403
    assert (
        client.post(
            "/teams/create", data={"name": "cross"}, headers={"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"}
        ).status_code
        == 403
    )
    assert (
        client.post(
            "/teams/create", data={"name": "evil"}, headers={"X-CSRF-Token": token, "Origin": "http://evil.example"}
        ).status_code
        == 403
    )
    assert client.post("/teams/create", data={"name": "research"}, headers={"X-CSRF-Token": token}).status_code == 200
    assert client.post("/teams/create", data={"name": "research2", "csrf_token": token}).status_code == 200
    assert client.post("/logout", follow_redirects=False).status_code == 403  # even signing out
    client.__exit__(None, None, None)
    other = signed_in(app, "otto")  # a token from one session is worthless in another
    assert other.post("/playground/clear", headers={"X-CSRF-Token": token}).status_code == 403
    other.__exit__(None, None, None)


def test_sign_in_form_itself_needs_its_token(app):
    with TestClient(app) as client:
        client.get("/login")
        response = client.post("/login", data={"username": "alice", "password": PASSWORDS["alice"]}, follow_redirects=False)
        assert response.status_code == 403


def test_bad_sign_ins_from_one_address_throttle_with_retry_after(app):
    with TestClient(app) as client:
        for _ in range(3):
            assert sign_in(client, "alice", "wrong-password").status_code == 401
        response = sign_in(client, "alice")  # even the right password waits now, from this address
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) > 0
        assert "Too many failed sign-ins from this address; try again in" in response.text
        assert "appliance_session" not in response.headers.get("set-cookie", "")


def test_viewer_gets_no_admin_buttons_and_403_on_admin_actions(app):
    client = signed_in(app, "victor")
    keys = client.get("/keys").text
    token = _csrf(keys)
    assert "/keys/create" not in keys and "Revoke" not in keys
    for path, form in (
        ("/keys/create", {"name": "x"}),
        ("/teams/create", {"name": "t"}),
        ("/models/load", {"name": "m"}),
        ("/models/delete", {"name": "m"}),
        ("/models/pull", {"url": "https://example.com/x.gguf"}),
        ("/users/create", {"username": "eve"}),
        ("/cache/purge", {}),
        ("/playground/send", {"prompt": "hi"}),
    ):
        assert client.post(path, data=form, headers={"X-CSRF-Token": token}).status_code == 403, path
    assert client.get("/playground").status_code == 403
    assert client.get("/users").status_code == 403
    client.__exit__(None, None, None)


def test_operator_may_operate_but_not_administer(app):
    client = signed_in(app, "otto")
    token = _csrf(client.get("/keys").text)
    assert client.get("/playground").status_code == 200
    assert client.post("/keys/create", data={"name": "x"}, headers={"X-CSRF-Token": token}).status_code == 403
    # operators reach the model actions (here no model `m` is installed: a clear 404, not a 403)
    assert (
        client.post("/models/load", data={"name": "m"}, headers={"X-CSRF-Token": token, "HX-Request": "true"}).status_code == 404
    )
    client.__exit__(None, None, None)


def test_logout_ends_the_session_for_real(app):
    client = signed_in(app, "alice")
    cookie = client.cookies.get("appliance_session")
    token = _csrf(client.get("/").text)
    assert client.post("/logout", headers={"X-CSRF-Token": token}, follow_redirects=False).status_code == 303
    with TestClient(app) as replay:
        replay.cookies.set("appliance_session", cookie)
        assert replay.get("/", follow_redirects=False).status_code == 303
    client.__exit__(None, None, None)


def test_first_run_password_change_is_forced_and_ends_other_sessions(app):
    services = app.state.services if hasattr(app.state, "services") else None
    with TestClient(app) as first:
        create_user(first.app.state.services.db, "root", "one-time-pass", role="admin", must_change_password=True)
        response = sign_in(first, "root", "one-time-pass")
        assert response.headers["location"] == "/password"
        assert first.get("/keys", follow_redirects=False).headers["location"] == "/password"
        with TestClient(app) as second:
            sign_in(second, "root", "one-time-pass")
            token = _csrf(first.get("/password").text)
            short = first.post(
                "/password", data={"current": "one-time-pass", "new": "short", "confirm": "short", "csrf_token": token}
            )
            assert short.status_code == 400
            done = first.post(
                "/password",
                data={"current": "one-time-pass", "new": "a-good-password", "confirm": "a-good-password", "csrf_token": token},
                follow_redirects=False,
            )
            assert done.status_code == 303 and done.headers["location"] == "/"
            assert first.get("/keys").status_code == 200
            assert second.get("/keys", follow_redirects=False).headers["location"].startswith("/login")
    assert services is None or services


def test_login_next_parameter_stays_on_this_site(app):
    with TestClient(app) as client:
        for evil in ("//evil.example/x", "https://evil.example", "/\\evil.example"):
            token = _csrf(client.get("/login").text)
            response = client.post(
                "/login",
                data={"username": "alice", "password": PASSWORDS["alice"], "csrf_token": token, "next": evil},
                follow_redirects=False,
            )
            assert response.headers["location"] == "/", evil


def test_audit_search_matches_the_text_as_written(app):
    """Underscores and percent signs are searched for, not treated as LIKE wildcards."""
    with TestClient(app) as anonymous:
        sign_in(anonymous, "otto", "not-the-password")  # audited as console.login_failed
    client = signed_in(app, "alice")  # audited as console.login

    def actions(q: str) -> list[str]:
        html = client.get("/audit", params={"q": q}).text
        return re.findall(r"<td><code>([^<]+)</code></td>", html)

    assert actions("login_failed") == ["console.login_failed"]
    assert actions("login") == ["console.login", "console.login_failed"]
    assert actions("login%failed") == [] and actions("login_") == ["console.login_failed"]
    assert actions("o_n") == []  # `_` would match any one character, as in "console"
    client.__exit__(None, None, None)


def _raise_budget_alert(app) -> None:
    """A key whose daily budget counter stands at 60 of 100 with a 50% alert share: the ledger's own raise."""
    import sqlite3

    from appliance.metering.alerts import raise_budget_alert

    conn = sqlite3.connect(app.state.services.settings.db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        key_id = conn.execute(
            "INSERT INTO api_keys (name, prefix, secret_hash, role, priority, created_at) VALUES"
            " ('budgeted', 'ak_budget', 'h-budget', 'user', 'interactive', 0) RETURNING id"
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO quotas (subject_type, subject_id, tokens_per_day, alert_percent) VALUES ('key', ?, 100, 50)", (key_id,)
        )
        counter = conn.execute(
            "INSERT INTO quota_counters (subject_type, subject_id, dimension, window_start, limit_value, spent, reserved)"
            " VALUES ('key', ?, 'tokens_per_day', 0, 100, 60, 0) RETURNING id",
            (key_id,),
        ).fetchone()[0]
        assert raise_budget_alert(conn, counter, 1.0, [80.0])
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_budget_alerts_show_as_a_banner_and_on_their_page_until_dismissed(app):
    viewer = signed_in(app, "victor")  # the app is running from here on
    _raise_budget_alert(app)
    banner = viewer.get("/alerts/banner").text
    assert (
        'data-testid="alerts-banner"' in banner
        and "budgeted (ak_budget…) reached 50% of its tokens per day (60 of 100)" in banner
    )
    assert 'hx-get="/alerts/banner"' in viewer.get("/").text  # every page loads the banner
    listing = viewer.get("/alerts").text
    assert listing.count('data-testid="alert-row"') == 1 and "Dismiss" not in listing  # viewers cannot dismiss
    operator = signed_in(app, "otto")
    listing = operator.get("/alerts").text
    alert_id = int(re.search(r'hx-post="/alerts/(\d+)/dismiss"', listing).group(1))
    token = _csrf(listing)
    assert (
        viewer.post(f"/alerts/{alert_id}/dismiss", headers={"X-CSRF-Token": _csrf(viewer.get("/alerts").text)}).status_code == 403
    )
    assert operator.post(f"/alerts/{alert_id}/dismiss").status_code == 403  # no CSRF token
    response = operator.post(f"/alerts/{alert_id}/dismiss", headers={"X-CSRF-Token": token, "HX-Request": "true"})
    assert response.status_code == 200 and "dismissed" in response.text
    assert "alerts-banner" not in viewer.get("/alerts/banner").text
    assert operator.post(f"/alerts/{alert_id}/dismiss", headers={"X-CSRF-Token": token}).status_code == 404
    for client in (operator, viewer):  # last in, first out: the two share the running services
        client.__exit__(None, None, None)
