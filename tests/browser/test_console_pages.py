"""Every console page renders without console errors and fits 1280 px and 390 px."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = [
    ("overview", "/", True),
    ("models", "/models", True),
    ("playground", "/playground", False),  # its docs screenshot is taken mid-conversation (test_console_flows)
    ("keys", "/keys", False),
    ("usage", "/usage", False),
    ("alerts", "/alerts", False),
    ("cache", "/cache", False),
    ("prices", "/prices", False),
    ("aliases", "/aliases", False),
    ("users", "/users", False),
    ("settings", "/settings", False),
    ("audit", "/audit", False),
    ("password", "/password", False),
]


def test_every_page_renders_and_fits(signed_in):
    s = signed_in("alice")
    for name, path, docs in PAGES:
        response = s.goto(path)
        assert response.status == 200, (path, response.status)
        assert s.page.locator("h1").first.inner_text().strip(), path
        s.shoot(name, docs=docs)


def test_login_page_fits(chromium, console_daemon):
    from tests.browser.conftest import SHOTS, _watch

    errors: list[str] = []
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    _watch(page, errors)
    page.goto(console_daemon.url + "/")
    assert page.url.endswith("/login")
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 800})
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        page.screenshot(path=str(SHOTS / f"login-{width}.png"))
    context.close()
    assert not errors, errors
