"""Prices for model families the appliance does not know, in headless Chromium and on the admin API of the real
daemon: refused with a message that names the known families; a catalog family not installed yet is taken."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TYPO = "gemma3-270m"  # the installed family is gemma-3-270m


def test_a_price_for_an_unknown_family_is_refused_naming_the_known_ones(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/prices")
    s.page.fill("[data-testid=price-model]", f"{TYPO}:q4_k_m")
    s.page.fill("[data-testid=price-input_per_m]", "2")
    s.page.click("[data-testid=price-save]")
    error = s.page.locator("#price-error-model")
    error.wait_for(timeout=30_000)
    text = error.inner_text()
    assert f"No model family named {TYPO}" in text and "gemma-3-270m" in text and "qwen2.5-7b-instruct" in text, text
    assert s.page.locator("[data-testid=price-model]").get_attribute("aria-invalid") == "true"
    assert s.page.locator(f"tr[data-price='{TYPO}:q4_k_m']").count() == 0

    with console_daemon.admin() as admin:
        refused = admin.put(f"/admin/prices/{TYPO}", json={"input_per_m": 1})
        assert refused.status_code == 400, refused.text
        error_body = refused.json()["error"]
        assert error_body["param"] == "model" and error_body["code"] == "unknown_model_family"
        assert "gemma-3-270m" in error_body["message"]
        assert all(p["model"] != TYPO for p in admin.get("/admin/prices").json())
        # a family of the catalog may be priced before it is installed
        assert admin.put("/admin/prices/qwen2.5-7b-instruct:q4_k_m", json={"input_per_m": 1}).status_code == 200
        assert admin.delete("/admin/prices/qwen2.5-7b-instruct:q4_k_m").status_code == 204
