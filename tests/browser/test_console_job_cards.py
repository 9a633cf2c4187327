"""Job cards in headless Chromium against the real daemon: a job that failed is drawn as failed (its error,
no bar), live and after a reload, even when it had copied every byte before it failed."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

IMPORT = "form[hx-post='/models/import']"


def _failed_card_shows_no_full_bar(card) -> None:
    assert card.locator(".job").get_attribute("data-state") == "failed"
    assert card.locator(".badge.state-failed").count() == 1
    assert card.locator("[data-testid=job-progress]").count() == 0  # no bar at all, let alone a full one
    assert card.locator("[data-testid=job-percent]").inner_text().strip() == "failed"
    assert "100%" not in card.inner_text()
    assert card.locator(".alert-error").inner_text().strip()  # why it failed


def test_a_failed_import_is_drawn_failed_not_as_a_full_bar(signed_in, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(2 * 1024 * 1024))  # passes the magic check, copied in full, then refused
    s = signed_in("alice")
    s.goto("/models")
    s.page.fill(f"{IMPORT} input[name=path]", str(broken))
    s.page.fill(f"{IMPORT} input[name=name]", "broken-card:f32")
    s.page.click(f"{IMPORT} button[type=submit]")
    card = s.page.locator("#jobs [data-job]").filter(has_text="broken-card:f32").first
    card.locator(".badge.state-failed").wait_for(timeout=60_000)
    _failed_card_shows_no_full_bar(card)

    s.goto("/models")  # the finished job, as the page lists it
    _failed_card_shows_no_full_bar(s.page.locator("#jobs [data-job]").filter(has_text="broken-card:f32").first)
