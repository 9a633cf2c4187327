"""Single sign-on refuses every ID token and callback it cannot trust (console, reliability row 16).

A small but real OpenID Connect provider runs on 127.0.0.1 in a thread: it serves
discovery, its JWKS and a token endpoint that hands out whatever ID token the test
minted with the provider's key (or with another key, or tampered afterwards), so
each broken token reaches the console exactly as a compromised or misconfigured
provider would send it. The console runs in-process over a migrated database.
Every refusal is a 4xx page without a stack trace, audited with its reason, and
leaves the browser signed out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.services import Services
from appliance.settings import Settings
from appliance.sso.provider import KEY_REFRESH_SECONDS

CLIENT_ID = "console-client"
SECRET = "canary-client-secret-5c1d"
BASE = "http://testserver.local"


class TokenProvider:
    """Discovery, keys and a token endpoint; ``id_token`` is what the next code is exchanged for."""

    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
        self.published = [self.key]
        self.id_token = ""
        self.token_requests: list[dict[str, str]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _json(self, body: object, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    self._json(
                        {
                            "issuer": provider.url,
                            "authorization_endpoint": provider.url + "/authorize",
                            "token_endpoint": provider.url + "/token",
                            "jwks_uri": provider.url + "/jwks",
                        }
                    )
                elif self.path == "/jwks":
                    self._json({"keys": [k.as_dict(private=False) for k in provider.published]})
                else:
                    self._json({"error": "not_found"}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                form["authorization"] = self.headers.get("Authorization", "")
                provider.token_requests.append(form)
                self._json({"access_token": "at", "token_type": "Bearer", "id_token": provider.id_token})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def claims(self, nonce: str, **changes: object) -> dict[str, object]:
        now = int(time.time())
        base: dict[str, object] = {
            "iss": self.url,
            "aud": CLIENT_ID,
            "sub": "u-1",
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            "preferred_username": "mallory",
            "groups": ["admins"],
        }
        base.update(changes)
        return {k: v for k, v in base.items() if v is not None}

    def sign(self, claims: dict[str, object], key: RSAKey | None = None, alg: str = "RS256") -> str:
        key = key or self.key
        return jwt.encode({"alg": alg, "kid": key.kid}, claims, key)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[TokenProvider]:
    running = TokenProvider()
    yield running
    running.close()


@pytest.fixture
def app(tmp_path, provider: TokenProvider):
    settings = Settings(
        data_dir=tmp_path,
        seed_default_model=False,
        oidc_issuer=provider.url,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=SECRET,
        oidc_group_roles={"admins": "admin"},
    )
    dbmod.migrate(settings.db_path)
    services = Services(settings)
    yield create_app(settings, services=services)
    services.db.dispose()


def start(client: TestClient) -> dict[str, str]:
    """Press the sign-in button; return the authorization request the console sent the browser to."""
    response = client.get("/login/oidc", follow_redirects=False)
    assert response.status_code == 303
    query = {k: v[0] for k, v in parse_qs(urlsplit(response.headers["location"]).query).items()}
    assert query["code_challenge_method"] == "S256" and query["client_id"] == CLIENT_ID
    return query


def callback(client: TestClient, state: str, code: str = "the-code"):
    return client.get("/login/oidc/callback", params={"state": state, "code": code}, follow_redirects=False)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def refused_reasons(app) -> list[str]:
    with sqlite3.connect(app.state.services.settings.db_path) as conn:
        return [d for (d,) in conn.execute("SELECT detail FROM audit_log WHERE action='console.sso_refused' ORDER BY id")]


def assert_refused(client: TestClient, response, status: int) -> None:
    assert response.status_code == status, response.text[:300]
    assert 'data-testid="sso-refused"' in response.text and "Traceback" not in response.text
    assert "appliance_session" not in response.cookies
    assert client.get("/keys", follow_redirects=False).headers["location"].startswith("/login")


def sign_in_with(client: TestClient, provider: TokenProvider, mint) -> object:
    query = start(client)
    provider.id_token = mint(query["nonce"])
    return callback(client, query["state"])


def test_a_good_token_signs_in_and_the_secret_goes_only_to_the_token_endpoint(app, provider):
    with TestClient(app, base_url=BASE) as client:
        ok = sign_in_with(client, provider, lambda nonce: provider.sign(provider.claims(nonce)))
        assert ok.status_code == 200 and "appliance_session" in ok.cookies
        assert client.get("/users").status_code == 200  # admin from the group
        request = provider.token_requests[-1]
        assert base64.b64decode(request["authorization"].split()[1]).decode() == f"{CLIENT_ID}:{SECRET}"
        assert request["redirect_uri"] == BASE + "/login/oidc/callback"
        verifier = request["code_verifier"]
        assert 43 <= len(verifier) <= 128
    reasons = refused_reasons(app)
    assert reasons == []


def test_tampered_signature_is_refused(app, provider):
    def tampered(nonce: str) -> str:
        header, _payload, signature = provider.sign(provider.claims(nonce, groups=["staff"])).split(".")
        forged = b64(json.dumps(provider.claims(nonce, groups=["admins"])).encode())
        return f"{header}.{forged}.{signature}"

    with TestClient(app, base_url=BASE) as client:
        assert_refused(client, sign_in_with(client, provider, tampered), 401)
        other = RSAKey.generate_key(2048, parameters={"kid": "k1"})  # same kid, an attacker's key
        assert_refused(client, sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n), key=other)), 401)
    assert refused_reasons(app) == ["reason=id token signature invalid client=testclient"] * 2


def test_none_and_hmac_with_the_public_key_are_refused(app, provider):
    public_pem = provider.key.as_pem(private=False)

    def unsigned(nonce: str) -> str:
        return f"{b64(json.dumps({'alg': 'none'}).encode())}.{b64(json.dumps(provider.claims(nonce)).encode())}."

    def hs256_with_public_key(nonce: str) -> str:
        signing_input = (
            f"{b64(json.dumps({'alg': 'HS256', 'kid': 'k1'}).encode())}.{b64(json.dumps(provider.claims(nonce)).encode())}"
        )
        return signing_input + "." + b64(hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest())

    with TestClient(app, base_url=BASE) as client:
        assert_refused(client, sign_in_with(client, provider, unsigned), 401)
        assert_refused(client, sign_in_with(client, provider, hs256_with_public_key), 401)
    assert refused_reasons(app) == [
        "reason=id token algorithm 'none' not accepted client=testclient",
        "reason=id token algorithm 'HS256' not accepted client=testclient",
    ]


def test_wrong_audience_is_refused(app, provider):
    with TestClient(app, base_url=BASE) as client:
        response = sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n, aud="another-app")))
        assert_refused(client, response, 401)
        response = sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n, aud=[CLIENT_ID, "x"], azp="x")))
        assert_refused(client, response, 401)
    assert refused_reasons(app) == [
        "reason=id token audience mismatch client=testclient",
        "reason=id token authorized party mismatch client=testclient",
    ]


def test_expired_token_is_refused(app, provider):
    past = int(time.time()) - 3600
    with TestClient(app, base_url=BASE) as client:
        response = sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n, iat=past - 300, exp=past)))
        assert_refused(client, response, 401)
    assert refused_reasons(app) == ["reason=id token expired client=testclient"]


def test_wrong_nonce_is_refused(app, provider):
    with TestClient(app, base_url=BASE) as client:
        response = sign_in_with(client, provider, lambda n: provider.sign(provider.claims("a-nonce-from-another-sign-in")))
        assert_refused(client, response, 401)
    assert refused_reasons(app) == ["reason=id token nonce mismatch client=testclient"]


def test_replayed_state_is_refused(app, provider):
    with TestClient(app, base_url=BASE) as client:
        query = start(client)
        provider.id_token = provider.sign(provider.claims(query["nonce"]))
        assert callback(client, query["state"]).status_code == 200
        client.cookies.delete("appliance_session")
        client.cookies.set("appliance_oidc", "", path="/login/oidc")  # nothing left to bind, but try anyway
        assert_refused(client, callback(client, query["state"]), 400)
    with TestClient(app, base_url=BASE) as elsewhere:  # a stolen callback URL, replayed from another browser
        assert_refused(elsewhere, callback(elsewhere, query["state"]), 400)
    assert refused_reasons(app) == ["reason=state unknown or already used client=testclient"] * 2


def test_state_from_another_browser_and_unknown_state_are_refused(app, provider):
    with TestClient(app, base_url=BASE) as victim, TestClient(app, base_url=BASE) as attacker:
        query = start(attacker)  # an attacker's sign-in, its callback URL planted on the victim
        provider.id_token = provider.sign(provider.claims(query["nonce"]))
        assert_refused(victim, callback(victim, query["state"]), 400)
        assert_refused(victim, callback(victim, "made-up-state"), 400)
        assert_refused(victim, victim.get("/login/oidc/callback", follow_redirects=False), 400)
    assert refused_reasons(app) == [
        "reason=state from another browser client=testclient",
        "reason=state unknown or already used client=testclient",
        "reason=state missing client=testclient",
    ]


def test_provider_error_is_shown_and_audited(app, provider):
    with TestClient(app, base_url=BASE) as client:
        query = start(client)
        response = client.get(
            "/login/oidc/callback", params={"state": query["state"], "error": "access_denied"}, follow_redirects=False
        )
        assert_refused(client, response, 401)
        assert "did not sign you in (access_denied)" in response.text
    assert refused_reasons(app) == ["reason=provider error access_denied client=testclient"]


def test_provider_down_is_a_clear_page(tmp_path):
    from tests.daemon import free_port

    settings = Settings(
        data_dir=tmp_path,
        seed_default_model=False,
        oidc_issuer=f"http://127.0.0.1:{free_port()}",
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=SECRET,
    )
    dbmod.migrate(settings.db_path)
    services = Services(settings)
    app = create_app(settings, services=services)
    with TestClient(app, base_url=BASE) as client:
        response = client.get("/login/oidc", follow_redirects=False)
        assert response.status_code == 424 and "not reachable" in response.text and SECRET not in response.text
    assert refused_reasons(app) == ["reason=provider unreachable (ConnectError) client=testclient"]
    services.db.dispose()


def test_rotated_keys_are_fetched_again_for_an_unknown_kid(app, provider):
    with TestClient(app, base_url=BASE) as client:
        assert sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n))).status_code == 200
        rotated = RSAKey.generate_key(2048, parameters={"kid": "k2"})
        provider.published = [provider.key, rotated]
        time.sleep(KEY_REFRESH_SECONDS + 0.5)  # keys are fetched again at most this often
        response = sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n), key=rotated))
        assert response.status_code == 200


def test_the_secret_and_tokens_never_reach_the_audit_log(app, provider):
    with TestClient(app, base_url=BASE) as client:
        token = provider.sign(provider.claims("wrong"))
        sign_in_with(client, provider, lambda n: token)
        sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n)))
    with sqlite3.connect(app.state.services.settings.db_path) as conn:
        rows = " ".join(str(r) for r in conn.execute("SELECT * FROM audit_log"))
    assert "console.sso_login" in rows and "console.sso_refused" in rows
    assert SECRET not in rows and token.split(".")[1] not in rows and token.split(".")[2] not in rows


def test_sso_users_cannot_use_the_local_sign_in_and_cannot_take_over_local_names(app, provider):
    from appliance.accounts.users import create_user, set_password

    with TestClient(app, base_url=BASE) as client:
        assert sign_in_with(client, provider, lambda n: provider.sign(provider.claims(n))).status_code == 200
        page = client.get("/settings").text
        assert SECRET not in page and "(set)" in page
    create_user(app.state.services.db, "root", "root-password-local-1", role="admin")
    with TestClient(app, base_url=BASE) as admin:
        token = re.search(r'name="csrf_token" value="([^"]+)"', admin.get("/login").text).group(1)
        admin.post("/login", data={"username": "root", "password": "root-password-local-1", "csrf_token": token})
        users = admin.get("/users").text
        assert "single sign-on</span>" in users and users.count("Reset password") == 0  # root is "(you)", mallory is SSO
        mallory = re.search(r'hx-post="/users/(\d+)/disable"', users).group(1)
        refused = admin.post(
            f"/users/{mallory}/reset", headers={"X-CSRF-Token": re.search(r'"X-CSRF-Token": "([^"]+)"', users).group(1)}
        )
        assert refused.status_code == 400 and "has no password here" in refused.text
    set_password(app.state.services.db, "mallory", "a-password-set-by-an-admin-1")  # even with a password set some other way
    with TestClient(app, base_url=BASE) as client:
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text).group(1)
        local = client.post(
            "/login",
            data={"username": "mallory", "password": "a-password-set-by-an-admin-1", "csrf_token": token},
            follow_redirects=False,
        )
        assert local.status_code == 401 and "appliance_session" not in local.cookies
    with TestClient(app, base_url=BASE) as client:
        response = sign_in_with(
            client, provider, lambda n: provider.sign(provider.claims(n, sub="u-2", preferred_username="root"))
        )
        assert_refused(client, response, 403)
        assert "already has another user named root" in response.text
    assert refused_reasons(app) == ["reason=user name root taken by another console user client=testclient"]
