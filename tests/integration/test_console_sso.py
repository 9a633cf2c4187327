"""Console single sign-on through a real OpenID Connect provider, against the real daemon.

The provider (``oidc-provider-mock``, tests/oidckit.py) issues real RS256 ID
tokens for the user and groups a test chooses; an httpx client follows the
redirects the way a browser does: console → provider's sign-in form → callback.
Local password sign-in is switched off in this daemon.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.daemon import RunningDaemon
from tests.oidckit import Provider, sso_daemon


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, Provider]]:
    with sso_daemon(tmp_path_factory.mktemp("sso"), APPLIANCE_LOCAL_LOGIN_ENABLED="false") as running:
        yield running


def csrf(html: str) -> str:
    match = re.search(r'"X-CSRF-Token": "([^"]+)"', html)
    assert match, html[:300]
    return match.group(1)


def sso_sign_in(daemon: RunningDaemon, provider: Provider, sub: str, next_url: str = "/") -> tuple[httpx.Client, httpx.Response]:
    """Start at the console's button, choose ``sub`` at the provider, land on the callback."""
    client = httpx.Client(follow_redirects=True, timeout=30)
    form = client.get(f"{daemon.url}/login/oidc", params={"next": next_url})
    assert form.status_code == 200 and form.url.host == "localhost", form.url  # the provider's sign-in form
    query = parse_qs(urlsplit(str(form.url)).query)
    assert query["code_challenge_method"] == ["S256"] and query["nonce"] and query["state"]
    landed = client.post(str(form.url), data={"sub": sub})
    return client, landed


def audit_rows(daemon: RunningDaemon, action: str) -> list[tuple[str, str]]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        return db.execute("SELECT actor, detail FROM audit_log WHERE action = ? ORDER BY id", (action,)).fetchall()


def test_login_page_offers_the_provider_and_no_password_form(box):
    daemon, _provider = box
    page = httpx.get(daemon.url + "/login")
    assert page.status_code == 200
    assert "Sign in with Mock IdP" in page.text and 'href="/login/oidc?next=/"' in page.text
    assert 'name="password"' not in page.text


def test_admin_from_the_provider_signs_in_and_sees_admin_pages(box):
    daemon, provider = box
    provider.set_user("ada-1", preferred_username="ada", email="ada@example.com", groups=["staff", "llm-admins"])
    client, landed = sso_sign_in(daemon, provider, "ada-1", next_url="/users")
    assert landed.status_code == 200 and landed.url.path == "/login/oidc/callback"
    assert '<meta http-equiv="refresh" content="0;url=/users">' in landed.text
    cookie = next(c for c in client.cookies.jar if c.name == "appliance_session")
    assert cookie.has_nonstandard_attr("HttpOnly") and cookie.get_nonstandard_attr("SameSite").lower() == "strict"
    users = client.get(daemon.url + "/users")
    assert users.status_code == 200 and users.url.path == "/users"
    assert 'class="badge role-admin">admin' in users.text and ">ada<" in users.text
    assert 'href="/password"' not in users.text  # no local password to change
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        assert db.execute("SELECT role, sso_subject FROM users WHERE username='ada'").fetchall() == [
            ("admin", f"{provider.url} ada-1")
        ]
    assert ("user:ada", "role=admin client=127.0.0.1") in audit_rows(daemon, "console.sso_login")
    # the same CSRF rules as any session: an unsafe request without the token is refused
    assert client.post(daemon.url + "/cache/purge").status_code == 403


def test_role_follows_the_groups_at_every_sign_in(box):
    daemon, provider = box
    provider.set_user("bo-1", preferred_username="bo", groups=["llm-ops"])
    client, _ = sso_sign_in(daemon, provider, "bo-1")
    assert client.get(daemon.url + "/playground").status_code == 200  # operator
    provider.set_user("bo-1", preferred_username="bo", groups=["staff"])
    again, _ = sso_sign_in(daemon, provider, "bo-1")
    assert again.get(daemon.url + "/playground").status_code == 403  # viewer now


def test_viewer_from_the_provider_gets_no_admin_controls_and_403(box):
    daemon, provider = box
    provider.set_user("vi-1", preferred_username="vi", groups=["staff", "unmapped"])
    client, _ = sso_sign_in(daemon, provider, "vi-1")
    keys = client.get(daemon.url + "/keys")
    assert keys.status_code == 200 and keys.url.path == "/keys"
    assert "/keys/create" not in keys.text and "Revoke" not in keys.text
    token = csrf(keys.text)
    for path, form in (("/keys/create", {"name": "x"}), ("/users/create", {"username": "eve"}), ("/cache/purge", {})):
        assert client.post(daemon.url + path, data=form, headers={"X-CSRF-Token": token}).status_code == 403, path
    assert client.get(daemon.url + "/users").status_code == 403


def test_no_mapped_group_is_refused_with_a_clear_page(box):
    daemon, provider = box
    provider.set_user("zed-1", preferred_username="zed", groups=["sales"])
    client, landed = sso_sign_in(daemon, provider, "zed-1")
    assert landed.status_code == 403
    assert "none of your groups gives access" in landed.text and "Traceback" not in landed.text
    assert client.get(daemon.url + "/", follow_redirects=False).headers["location"].startswith("/login")
    assert ("user:?", "reason=no console role for zed client=127.0.0.1") in audit_rows(daemon, "console.sso_refused")


def test_logout_ends_the_session_and_the_providers(box):
    daemon, provider = box
    provider.set_user("lo-1", preferred_username="lou", groups=["staff"])
    client, _ = sso_sign_in(daemon, provider, "lo-1")
    token = csrf(client.get(daemon.url + "/").text)
    out = client.post(daemon.url + "/logout", data={"csrf_token": token}, follow_redirects=False)
    assert out.status_code == 200
    target = re.search(r'content="0;url=([^"]+)"', out.text).group(1).replace("&amp;", "&")
    assert target.startswith(provider.url + "/oauth2/end_session?")
    query = parse_qs(urlsplit(target).query)
    assert query["post_logout_redirect_uri"] == [daemon.url + "/login"] and query["id_token_hint"][0].count(".") == 2
    assert client.get(daemon.url + "/", follow_redirects=False).status_code == 303  # the session is gone
    ended = client.get(target)  # the provider's logout page answers
    assert ended.status_code == 200


def test_local_sign_in_is_refused_when_switched_off(box):
    daemon, _provider = box
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    engine = make_engine(daemon.data_dir / "appliance.db")
    create_user(engine, "breakglass", "breakglass-password-1", role="admin")
    engine.dispose()
    client = httpx.Client(timeout=30)
    token = re.search(r'"X-CSRF-Token": "([^"]+)"', client.get(daemon.url + "/login").text).group(1)
    refused = client.post(
        daemon.url + "/login",
        data={"username": "breakglass", "password": "breakglass-password-1", "csrf_token": token},
        follow_redirects=False,
    )
    assert refused.status_code == 403 and "switched off" in refused.text
    assert "appliance_session" not in refused.cookies


def test_the_client_secret_is_never_written_down(box):
    daemon, provider = box
    assert provider.client_secret not in daemon.log()
    dump = b"".join(path.read_bytes() for path in daemon.data_dir.glob("appliance.db*"))
    assert provider.client_secret.encode() not in dump
    provider.set_user("se-1", preferred_username="sec", groups=["llm-admins"])
    settings, _ = sso_sign_in(daemon, provider, "se-1")
    assert provider.client_secret not in settings.get(daemon.url + "/settings").text
