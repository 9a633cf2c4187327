"""Single sign-on in headless Chromium: the "Sign in with …" button → the provider → back, signed in.

The provider (tests/oidckit.py) answers on ``localhost`` and the console on
``127.0.0.1``: different sites, so the browser applies its SameSite rules to the
trip exactly as with a real identity provider (the sign-in cookie must come back
on the callback, and the session cookie must be sent on the first console page).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.conftest import SHOTS, WIDE
from tests.daemon import RunningDaemon
from tests.oidckit import Provider, sso_daemon


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, Provider]]:
    with sso_daemon(tmp_path_factory.mktemp("sso-browser")) as running:
        yield running


def test_sign_in_with_the_provider_and_out_again(chromium, box):
    daemon, provider = box
    provider.set_user("ada-9", preferred_username="ada", groups=["llm-admins"])
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on(
        "console",
        lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" and page.url.startswith(daemon.url) else None,
    )
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    try:
        page.goto(daemon.url + "/keys")  # signed out: sent to the sign-in page, which offers both ways in
        assert page.url.startswith(daemon.url + "/login")
        assert page.locator("input[name=password]").count() == 1
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "login-sso-1280.png"))
        with page.expect_navigation(url=lambda url: url.startswith(provider.url)):
            page.get_by_text("Sign in with Mock IdP").click()
        page.fill("input[name=sub]", "ada-9")
        with page.expect_navigation(url=daemon.url + "/keys", timeout=20_000):
            page.get_by_role("button", name="Authorize").click()
        page.wait_for_load_state("networkidle")
        assert page.url == daemon.url + "/keys"
        assert page.locator(".who-name").inner_text() == "ada"
        assert page.locator(".who .badge").inner_text() == "admin"
        assert page.locator("a[href='/password']").count() == 0
        cookies = {c["name"]: c for c in context.cookies(daemon.url)}
        assert cookies["appliance_session"]["httpOnly"] and cookies["appliance_session"]["sameSite"] == "Strict"
        assert "appliance_oidc" not in cookies  # the sign-in binding is gone once used

        with page.expect_navigation(url=lambda url: url.startswith(provider.url + "/oauth2/end_session")):
            page.get_by_test_id("logout").click()
        page.goto(daemon.url + "/keys")
        assert page.url.startswith(daemon.url + "/login")
    finally:
        context.close()
    assert not errors, errors
