"""Admin settings from the console, in headless Chromium against the real daemon, each seen taking effect through the API.

A price set in the console prices the next request in the ledger; an alias added
in the console is served by its target; a key's cache policy set in the console
changes its `x-cache`; quotas of a key and of a team set in the console refuse
with 429; a quantization started in the console runs as a job to 100% and
installs the variant; the settings page says where each value came from. Viewers
and operators see none of the controls and are refused the actions (403).
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.ggufkit import make_tiny_gguf

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "gemma-3-270m:q4_k_m"


def _key(console_daemon, name: str, **fields: object) -> tuple[int, str]:
    with console_daemon.admin() as admin:
        response = admin.post("/admin/keys/", json={"name": name, **fields})
        response.raise_for_status()
        body = response.json()
        return body["id"], body["secret"]


def _complete(api: httpx.Client, model: str = MODEL, **fields: object) -> httpx.Response:
    return api.post(
        "/v1/completions",
        json={"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0.7, **fields},
    )


def test_a_price_set_in_the_console_prices_the_next_request(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/prices")
    s.page.fill("[data-testid=price-model]", MODEL)
    s.page.fill("[data-testid=price-input_per_m]", "-1")
    s.page.click("[data-testid=price-save]")
    # the refusal is shown next to its field and in the form's live region, not at the top of the page
    error = s.page.locator("[data-testid=price-form] #price-error-input_per_m")
    error.wait_for()
    assert "greater than or equal to 0" in error.inner_text()
    assert s.page.locator("[data-testid=price-input_per_m]").get_attribute("aria-invalid") == "true"
    assert "Not saved" in s.page.locator("[data-testid=price-form] [data-testid=price-feedback]").inner_text()
    assert s.page.locator("[data-testid=price-feedback]").get_attribute("aria-live") == "polite"
    assert s.page.locator("#errors").inner_text().strip() == ""
    assert s.page.locator("[data-testid=price-model]").input_value() == MODEL  # what was typed is kept

    s.page.fill("[data-testid=price-input_per_m]", "1000")
    s.page.fill("[data-testid=price-output_per_m]", "3000")
    s.page.fill("[data-testid=price-cached_per_m]", "500")
    s.page.click("[data-testid=price-save]")
    s.page.wait_for_selector(f"tr[data-price='{MODEL}']")
    assert "USD per 1M tokens" in s.page.locator("[data-testid=price-feedback]").inner_text()
    row = s.page.locator(f"tr[data-price='{MODEL}']").inner_text()
    assert "1000" in row and "3000" in row and "500" in row and "USD" in row
    s.shoot("prices")

    key_id, secret = _key(console_daemon, "priced")
    with console_daemon.client(secret) as api:
        answer = _complete(api)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    with console_daemon.admin() as admin:
        totals = admin.get("/admin/usage", params={"key": str(key_id)}).json()["totals"]
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    # prompt tokens the engine served from its prefix cache are priced at the cached rate
    cached = totals["cached_tokens"]
    expected = ((totals["prompt_tokens"] - cached) * 1000 + cached * 500 + totals["completion_tokens"] * 3000) / 1e6
    assert totals["cost"] == pytest.approx(expected), (totals, usage)
    assert totals["cost"] > 0

    s.page.locator(f"tr[data-price='{MODEL}'] [data-testid=price-clear]").click()  # hx-confirm: accepted
    s.page.wait_for_selector(f"tr[data-price='{MODEL}']", state="detached")
    with console_daemon.admin() as admin:
        assert admin.get(f"/admin/prices/{MODEL}").status_code == 404
    s.goto("/audit")
    text = s.page.locator("table").inner_text()
    assert "price.set" in text and "price.delete" in text


def test_an_alias_added_in_the_console_is_served_by_its_target(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/aliases")
    s.page.fill("[data-testid=alias-name]", "default")
    s.page.click("[data-testid=alias-save]")
    s.page.wait_for_selector("[data-testid=alias-form] #alias-error-name")
    assert "default_model" in s.page.locator("#alias-error-name").inner_text()

    s.page.fill("[data-testid=alias-name]", "support-bot")
    s.page.select_option("[data-testid=alias-target]", MODEL)
    s.page.click("[data-testid=alias-save]")
    s.page.wait_for_selector("tr[data-alias='support-bot']")
    assert MODEL in s.page.locator("tr[data-alias='support-bot']").inner_text()
    s.shoot("aliases")

    _key_id, secret = _key(console_daemon, "alias-user")
    with console_daemon.client(secret) as api:
        assert "support-bot" in {m["id"] for m in api.get("/v1/models").json()["data"]}
        answer = _complete(api, model="support-bot")
        assert answer.status_code == 200, answer.text
        with console_daemon.admin() as admin:
            by_model = admin.get("/admin/usage", params={"key": str(_key_id), "by": "model"}).json()
        assert [g.get("model") for g in by_model["rows"]] == [MODEL], by_model

        s.page.locator("tr[data-alias='support-bot'] [data-testid=alias-delete]").click()
        s.page.wait_for_selector("tr[data-alias='support-bot']", state="detached")
        assert _complete(api, model="support-bot").status_code == 404
    s.goto("/audit")
    text = s.page.locator("table").inner_text()
    assert "alias.set" in text and "alias.delete" in text


def test_a_key_cache_policy_set_in_the_console_changes_x_cache(signed_in, console_daemon):
    key_id, secret = _key(console_daemon, "cache-policy")
    body = {"prompt": "Cache policy check: one, two,", "temperature": 0, "max_tokens": 3}
    with console_daemon.client(secret) as api:
        assert _complete(api, **body).headers["x-cache"] == "miss"
        assert _complete(api, **body).headers["x-cache"] == "exact"

        s = signed_in("alice")
        s.goto("/cache")
        row = s.page.locator(f"tr[data-subject='key:{key_id}']")
        assert "inherits" in row.inner_text() and "not cached" not in row.inner_text()
        s.page.select_option("[data-testid=policy-subject]", f"key:{key_id}")
        s.page.select_option("[data-testid=policy-enabled]", "off")
        s.page.click("[data-testid=policy-save]")
        s.page.wait_for_selector(f"tr[data-subject='key:{key_id}'] .badge.bad")
        assert "enabled off" in s.page.locator(f"tr[data-subject='key:{key_id}']").inner_text()
        assert (
            f"Cache policy of cache-policy ({secret[:12]}…) saved."
            in s.page.locator("[data-testid=policy-feedback]").inner_text()
        )
        s.shoot("cache-policies")
        assert _complete(api, **body).headers["x-cache"] == "miss"  # the cached answer is no longer served to this key

        s.page.locator(f"tr[data-subject='key:{key_id}'] [data-testid=policy-clear]").click()
        s.page.wait_for_selector(f"tr[data-subject='key:{key_id}'] [data-testid=policy-clear]", state="detached")
        assert _complete(api, **body).headers["x-cache"] == "exact"
    with console_daemon.admin() as admin:
        assert admin.get("/admin/cache/policy", params={"scope": "key", "id": str(key_id)}).json()["policy"] is None


def test_quotas_of_a_key_and_a_team_set_in_the_console_refuse_with_429(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/keys")
    s.page.fill("input[placeholder='e.g. research']", "quota-team")
    s.page.locator("button", has_text="Create team").click()
    s.page.wait_for_selector("#keys-area td:has-text('quota-team')")
    with console_daemon.admin() as admin:
        team_id = next(t["id"] for t in admin.get("/admin/teams").json() if t["name"] == "quota-team")
    key_id, key_secret = _key(console_daemon, "quota-key")
    _member_id, member_secret = _key(console_daemon, "quota-member", team_id=team_id)
    s.goto("/keys")

    edit = s.page.locator(f"tr[data-key='{key_secret[:12]}'] + tr.edit-row")
    edit.locator("summary").click()
    edit.locator("input[name=requests_per_minute]").fill("1")
    edit.locator("button", has_text="Save quota").click()
    s.page.wait_for_selector("#keys-area .alert-ok")
    team = s.page.locator("section[aria-label=Teams] tr", has_text="quota-team")
    team.locator("summary").click()
    team.locator("input[name=requests_per_minute]").fill("1")
    team.locator("button", has_text="Save quota").click()
    s.page.wait_for_selector("section[aria-label=Teams] tr:has-text('quota-team') .badge:has-text('requests per minute 1')")

    for secret in (key_secret, member_secret):
        with console_daemon.client(secret) as api:
            assert _complete(api).status_code == 200
            refused = _complete(api)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"]
    with console_daemon.admin() as admin:
        assert admin.get(f"/admin/quotas/key:{key_id}").json()["limits"]["requests_per_minute"] == 1
        assert admin.get("/admin/quotas/team:quota-team").json()["limits"]["requests_per_minute"] == 1


def test_quantize_from_the_console_runs_as_a_job_and_installs_the_variant(signed_in, console_daemon, tmp_path):
    source = make_tiny_gguf(tmp_path / "tinyq.f32.gguf", vocab=512, n_embd=64)
    with console_daemon.admin() as admin:
        job = admin.post("/admin/models/import", json={"path": str(source), "name": "tinyq:f32"}).json()
        deadline = time.monotonic() + 120
        while admin.get(f"/admin/jobs/{job['id']}").json()["state"] not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert admin.get(f"/admin/jobs/{job['id']}").json()["state"] == "done"
    s = signed_in("alice")
    s.goto("/models")
    row = s.page.locator("#installed tr[data-model='tinyq:f32']")
    row.locator("details.quantize summary").click()
    options = row.locator("[data-testid=quantize-to] option").all_inner_texts()
    assert "q8_0" in options and "f16" in options and "f32" not in options
    row.locator("[data-testid=quantize-to]").select_option("q8_0")
    row.locator("[data-testid=quantize-submit]").click()
    s.page.locator("#jobs [data-testid=job-progress]").first.wait_for()
    s.page.wait_for_function(
        "() => { const p = document.querySelector('#jobs [data-testid=job-percent]');"
        " return p && p.textContent.trim() === '100%' }",
        timeout=120_000,
    )
    s.page.wait_for_selector("#installed tr[data-model='tinyq:q8_0']", timeout=60_000)
    with console_daemon.admin() as admin:
        info = admin.get("/admin/models/tinyq:q8_0").json()
    assert (info["status"], info["parent"], info["quantization"].lower()) == ("ready", "tinyq:f32", "q8_0")
    # a target the quantizer refuses answers at once, nothing started
    refused = s.page.request.post(
        console_daemon.url + "/models/quantize",
        form={"name": "tinyq:f32", "to": "q9_z"},
        headers={"X-CSRF-Token": s.csrf(), "HX-Request": "true"},
    )
    assert refused.status == 400 and "unknown target" in refused.text()
    s.goto("/audit")
    assert "model.quantize" in s.page.locator("table").inner_text()


def test_the_settings_page_says_where_each_value_came_from(signed_in, console_daemon):
    s = signed_in("victor")
    s.goto("/settings")
    data_dir = s.page.locator("tr[data-setting=data_dir] [data-testid=origin]").inner_text()
    assert "environment" in data_dir and "APPLIANCE_DATA_DIR" in data_dir
    assert s.page.locator("tr[data-setting=oidc_provider_name] [data-testid=origin]").inner_text().strip() == "default"
    assert "(generated, in the data dir)" in s.page.locator("tr[data-setting=session_secret]").inner_text()


@pytest.mark.parametrize("username", ["victor", "otto"])
def test_viewers_and_operators_see_no_admin_setting_controls_and_are_refused(signed_in, console_daemon, username):
    s = signed_in(username)
    s.goto("/prices")
    assert s.page.locator("h1").inner_text() == "Prices"
    assert s.page.locator("[data-testid=price-form], [data-testid=price-clear]").count() == 0
    s.goto("/aliases")
    assert s.page.locator("tr[data-alias='default']").count() == 1  # the list is readable
    assert s.page.locator("[data-testid=alias-form], [data-testid=alias-delete]").count() == 0
    s.goto("/cache")
    assert s.page.locator("[data-testid=cache-subjects]").count() == 1
    assert s.page.locator("[data-testid=policy-form], [data-testid=policy-clear], button:has-text('Save policy')").count() == 0
    s.goto("/keys")
    assert s.page.locator("button:has-text('Save quota')").count() == 0
    s.goto("/models")
    assert s.page.locator("[data-testid=quantize-submit], details.quantize").count() == 0
    token = s.csrf()
    for path, form in (
        ("/prices/set", {"model": "*", "input_per_m": "1"}),
        ("/prices/clear", {"model": "*"}),
        ("/aliases/set", {"name": "sneaky", "target": MODEL}),
        ("/aliases/delete", {"name": "sneaky"}),
        ("/cache/policy", {"enabled": "on"}),
        ("/cache/policies/set", {"subject": "key:1", "enabled": "off"}),
        ("/cache/policies/clear", {"subject": "key:1"}),
        ("/quotas/key:1", {"requests_per_minute": "1"}),
        ("/models/quantize", {"name": MODEL, "to": "q8_0"}),
    ):
        response = s.page.request.post(console_daemon.url + path, form=form, headers={"X-CSRF-Token": token})
        assert response.status == 403, (path, response.status)
    with console_daemon.admin() as admin:
        assert admin.get("/admin/prices").json() == [] or all(p["model"] != "*" for p in admin.get("/admin/prices").json())
        assert "sneaky" not in admin.get("/admin/aliases/").json()


def test_admin_setting_forms_need_the_csrf_token(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/prices")
    for path, form in (
        ("/prices/set", {"model": "*", "input_per_m": "1"}),
        ("/aliases/set", {"name": "x", "target": MODEL}),
        ("/cache/policies/set", {"subject": "key:1", "enabled": "off"}),
        ("/models/quantize", {"name": MODEL, "to": "q8_0"}),
    ):
        response = s.page.request.post(console_daemon.url + path, form=form)
        assert response.status == 403, (path, response.status)
    with console_daemon.admin() as admin:
        assert all(p["model"] != "*" for p in admin.get("/admin/prices").json())
