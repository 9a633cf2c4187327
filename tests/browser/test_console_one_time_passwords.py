"""One-time passwords on the Users page, in headless Chromium against the real daemon: adding several users
keeps every new password on screen until the admin dismisses it, each one works once, and none is shown again
after a reload."""

from __future__ import annotations

import pytest

from tests.browser.conftest import WIDE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CREATE = "form[hx-post='/users/create']"
NEW_USERS = ("otp-ana", "otp-ben", "otp-cy")


def _card(page, username: str):
    return page.locator("#one-time-passwords [data-one-time]", has_text=f"One-time password for {username}")


def test_every_new_password_stays_until_dismissed(signed_in, chromium, console_daemon):
    s = signed_in("alice")
    s.goto("/users")
    for username in NEW_USERS:
        s.page.fill(f"{CREATE} input[name=username]", username)
        s.page.click(f"{CREATE} button[type=submit]")
        s.page.locator(f"#users-area tr[data-user='{username}']").wait_for(timeout=30_000)
    # a later change on the page (a role) keeps them too
    s.page.select_option("select[aria-label='Role of otp-ben']", "operator")
    s.page.locator("#users-area", has_text="otp-ben is now operator").wait_for(timeout=30_000)

    passwords = {}
    for username in NEW_USERS:
        card = _card(s.page, username)
        assert card.count() == 1, username
        passwords[username] = card.locator("code").inner_text().strip()
    assert len(set(passwords.values())) == len(NEW_USERS) and all(passwords.values())

    _card(s.page, "otp-ben").locator("button", has_text="Dismiss").click()
    assert _card(s.page, "otp-ben").count() == 0
    assert _card(s.page, "otp-ana").count() == 1 and _card(s.page, "otp-cy").count() == 1

    # each shown password signs its user in (to choose their own)
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    try:
        page = context.new_page()
        page.goto(console_daemon.url + "/login")
        page.fill("input[name=username]", "otp-ana")
        page.fill("input[name=password]", passwords["otp-ana"])
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert page.url.endswith("/password"), page.url
    finally:
        context.close()

    s.goto("/users")  # shown once: a reload shows none of them
    assert s.page.locator("#one-time-passwords [data-one-time]").count() == 0
    assert all(p not in s.page.content() for p in passwords.values())
