"""Rotating a key and setting its expiry from the console, in headless Chromium against the real daemon.

No CLI and no restart: the admin rotates the key on the Keys page with a one-hour overlap, copies the new secret
(shown once), both secrets answer during the overlap, the expiring-soon list names the old secret, and the admin
then sets the key to expire in three days, which the list and the admin API both show; a team is renamed from its row.
"""

from __future__ import annotations

import time

import httpx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _status(base: str, secret: str) -> int:
    return httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30).status_code


def test_a_key_is_rotated_and_given_an_expiry_from_the_console(signed_in, console_daemon):
    old_secret = console_daemon.create_key("rotated-in-console")
    s = signed_in("alice")
    s.goto("/keys")
    edit = s.page.locator(f"tr[data-key='{old_secret[:12]}'] + tr.edit-row")
    edit.locator("summary").click()
    edit.locator("[data-testid=overlap-hours]").select_option("1")
    edit.locator("[data-testid=rotate-key]").click()  # hx-confirm: the dialog is accepted
    s.page.wait_for_selector("[data-testid=new-key] h2:has-text('rotated')")
    new_secret = s.page.locator("[data-testid=new-secret]").inner_text().strip()
    assert new_secret.startswith("ak_") and new_secret != old_secret
    assert "keeps working until" in s.page.locator("[data-testid=new-key]").inner_text()
    assert _status(console_daemon.url, new_secret) == 200
    assert _status(console_daemon.url, old_secret) == 200  # in the overlap
    soon = s.page.locator("[data-testid=expiring-soon]").inner_text()
    assert f"old secret of rotated-in-console ({old_secret[:12]}…)" in soon
    s.shoot("keys-rotated")

    s.goto("/keys")  # shown once: a reload has neither secret
    assert s.page.locator("[data-testid=new-secret]").count() == 0
    assert new_secret not in s.page.content() and old_secret not in s.page.content()

    edit = s.page.locator(f"tr[data-key='{new_secret[:12]}'] + tr.edit-row")
    edit.locator("summary").click()
    edit.locator("[data-testid=expiry-days]").fill("3")
    edit.locator("[data-testid=set-expiry]").click()
    s.page.wait_for_selector("#keys-area .alert-ok:has-text('Expiry of rotated-in-console')")
    soon = s.page.locator("[data-testid=expiring-soon]").inner_text()
    assert f"rotated-in-console ({new_secret[:12]}…) expires" in soon
    with console_daemon.admin() as admin:
        key = next(k for k in admin.get("/admin/keys/").json() if k["prefix"] == new_secret[:12])
    assert key["expires_at"] == pytest.approx(time.time() + 3 * 86400, abs=120)
    assert _status(console_daemon.url, new_secret) == 200

    with console_daemon.admin() as admin:  # a team is renamed from its row
        admin.post("/admin/teams", json={"name": "console-team"}).raise_for_status()
    s.goto("/keys")
    team = s.page.locator("section[aria-label=Teams] tr[data-team='console-team']")
    team.locator("summary").click()
    team.locator("[data-testid=rename-team-console-team]").fill("console-squad")
    team.locator("button", has_text="Rename").click()
    s.page.wait_for_selector("section[aria-label=Teams] tr[data-team='console-squad']")
    s.goto("/audit")
    text = s.page.locator("table").inner_text()
    assert "key.rotate" in text and "key.expiry" in text and "team.rename" in text
