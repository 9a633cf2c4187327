"""The manual at /docs works in a real browser under its Content-Security-Policy.

The theme's scripts (navigation, search in a web worker) run only if the policy allows the pages'
inline bootstrap by hash and the box's own files: a violation is a console error, which the
``signed_in`` fixture fails on, and search would find nothing. Nothing is requested off the box.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.manualkit import ensure_installed_site

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_viewer_reads_and_searches_the_manual_with_nothing_blocked(signed_in):
    ensure_installed_site()
    s = signed_in("victor")  # the least role: the manual is for every console user
    requested: list[str] = []
    s.page.on("request", lambda request: requested.append(request.url))
    violations: list[str] = []
    s.page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)

    response = s.goto("/docs/")
    assert response.status == 200
    assert "script-src 'self' 'sha256-" in response.headers["content-security-policy"]
    assert s.page.locator("h1").first.inner_text().startswith("LLM appliance")

    s.page.locator("nav a", has_text="Install and operate").first.click()
    s.page.wait_for_load_state("networkidle")
    assert s.page.url.endswith("/docs/install.html")
    s.shoot("manual-install")  # fits 1280 px and 390 px (wide tables scroll inside the page)

    s.page.locator("input.md-search__input").click()
    s.page.keyboard.type("quantize", delay=30)  # keystrokes, as a reader types: the theme searches on key events
    results = s.page.locator(".md-search-result__item")
    results.first.wait_for(timeout=30_000)  # the search worker (a file of the site) built its index and answered
    assert results.count() > 0

    assert not violations, violations
    box = urlparse(s.base).netloc
    assert requested and all(urlparse(url).netloc == box or url.startswith("data:") for url in requested), requested
