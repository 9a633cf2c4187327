"""The console over HTTPS in headless Chromium: sign-in against the real daemon serving its own certificate.

Chromium accepts the daemon's certificate through ``--ignore-certificate-errors-spki-list`` naming the
SHA-256 of that certificate's public key alone: every other certificate is still checked as usual (no NSS
tools on the test machines to add the box's CA to a Chromium profile). The session cookie comes back
Secure, pages carry Strict-Transport-Security, and the settings page shows the fingerprint openssl sees.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, _watch, sign_in
from tests.tlskit import TlsDaemon, openssl_fingerprint, s_client, start_tls_daemon

pytestmark = [pytest.mark.browser, pytest.mark.slow]

playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")


@pytest.fixture(scope="module")
def https_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    running = start_tls_daemon(tmp_path_factory.mktemp("https-console"))
    engine = make_engine(running.data_dir / "appliance.db")
    create_user(engine, "alice", "alice-password-1", role="admin")
    engine.dispose()
    yield running
    running.stop()


def _spki_pin(box: TlsDaemon) -> str:
    cert = x509.load_pem_x509_certificate((box.data_dir / "tls" / "server.crt").read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def test_console_sign_in_over_https(https_box: TlsDaemon) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (./test.sh installs it: apt-get install -y chromium)")
    args = [*CHROMIUM_ARGS, f"--ignore-certificate-errors-spki-list={_spki_pin(https_box)}"]
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            errors: list[str] = []
            _watch(page, errors)
            first = page.goto(https_box.url + "/login")
            assert first is not None and first.ok
            assert first.headers.get("strict-transport-security") == "max-age=31536000"
            sign_in(page, https_box.url, "alice", "alice-password-1")
            assert page.url.startswith(https_box.url)
            assert "/login" not in page.url, page.content()[:500]
            cookies = {c["name"]: c for c in context.cookies()}
            assert cookies["appliance_session"]["secure"] is True
            assert cookies["appliance_session"]["httpOnly"] is True
            assert all(c["secure"] for c in cookies.values()), cookies

            page.goto(https_box.url + "/settings")
            page.wait_for_load_state("networkidle")
            shown = page.locator("[data-testid=tls-certificate]").inner_text()
            assert openssl_fingerprint(s_client(https_box.port)) in shown
            page.set_viewport_size({"width": 390, "height": 900})
            page.wait_for_timeout(150)
            assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
            # An unsafe request from the page passes the CSRF and origin checks over https: sign out through its form.
            page.set_viewport_size({"width": 1280, "height": 900})
            with page.expect_navigation():
                page.click("[data-testid=logout]")
            assert page.url.startswith(https_box.url + "/login"), page.url
            assert "appliance_session" not in {c["name"] for c in context.cookies()}
            context.close()
            assert not errors, errors
        finally:
            browser.close()
