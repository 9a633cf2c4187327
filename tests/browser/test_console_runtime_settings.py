"""Settings changed live from the console's Settings page, in headless Chromium against the real daemon.

An admin picks another installed model as the appliance's default model and sets the alert webhook (secret,
then URL): the `default` alias serves the new model at once, and the next budget alert reaches the new
webhook, signed with the new secret, with no CLI and no restart. A bad value is refused beside its field
with what was typed kept; a restart setting is marked pending; viewers see the values without the forms.
On the Models page an admin makes an installed model the appliance's default after a confirmation naming the
current one; the change is the default_model setting's, written and audited as the Settings page's is.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.ggufkit import make_tiny_gguf
from tests.webhookkit import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEFAULT = "gemma-3-270m:q4_k_m"
SECRET = "console-webhook-secret"


def _save(s, name: str, value: str, *, select: bool = False) -> object:
    row = s.page.locator(f"tr[data-setting={name}]")
    field = row.locator("[data-testid=setting-value]")
    if select:
        field.select_option(value)
    else:
        field.fill(value)
    row.locator("[data-testid=setting-save]").click()
    done = f"tr[data-setting={name}] [data-testid=setting-saved], tr[data-setting={name}] [data-testid=setting-error]"
    s.page.wait_for_selector(done)
    return s.page.locator(f"tr[data-setting={name}]")


def _import_tiny(console_daemon, tmp_path, family: str = "tinydefault") -> str:
    source = make_tiny_gguf(tmp_path / f"{family}.f32.gguf", vocab=512, n_embd=64)
    with console_daemon.admin() as admin:
        job = admin.post("/admin/models/import", json={"path": str(source), "name": f"{family}:f32"}).json()
        deadline = time.monotonic() + 120
        while admin.get(f"/admin/jobs/{job['id']}").json()["state"] not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert admin.get(f"/admin/jobs/{job['id']}").json()["state"] == "done"
    return f"{family}:f32"


def _budget_alerts(receiver: Receiver) -> list[bytes]:
    return [payload for _headers, payload in receiver.received if json.loads(payload)["type"] == "budget.alert"]


def test_default_model_and_webhook_change_live_from_the_console(signed_in, console_daemon, tmp_path):
    tiny = _import_tiny(console_daemon, tmp_path)
    receiver = Receiver()
    s = signed_in("alice")
    try:
        s.goto("/settings")
        # a bad value stays in its field, refused beside it; nothing is written
        row = _save(s, "currency", "not a currency!")
        assert "currency" in row.locator("[data-testid=setting-error]").inner_text()
        assert row.locator("[data-testid=setting-value]").input_value() == "not a currency!"
        assert row.locator("[data-testid=setting-value]").get_attribute("aria-invalid") == "true"
        assert "currency" not in console_daemon.config_file.read_text()

        row = _save(s, "default_model", tiny, select=True)
        assert "Applied now." in row.inner_text()
        with console_daemon.admin() as admin:
            assert admin.get("/admin/aliases").json()["default"] == tiny
            answer = admin.post("/v1/completions", json={"model": "default", "prompt": "Hello", "max_tokens": 2})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == tiny  # served by the new default, no restart

        assert "Applied now." in _save(s, "alert_webhook_secret", SECRET).inner_text()
        row = _save(s, "alert_webhook_url", receiver.url)
        assert "Applied now." in row.inner_text() and row.locator("[data-testid=applies-live]").count() == 1
        assert SECRET not in s.page.content()
        with console_daemon.admin() as admin:
            key = admin.post("/admin/keys/", json={"name": "console-alerted"}).json()["secret"]
            admin.put(f"/admin/quotas/key:{key[:12]}", json={"tokens_per_day": 300, "alert_percent": 1}).raise_for_status()
        with console_daemon.client(key) as client:
            body = {"model": DEFAULT, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}
            for seed in range(2):
                assert client.post("/v1/completions", json={**body, "seed": seed}).status_code == 200
        deadline = time.monotonic() + 30
        while not _budget_alerts(receiver) and time.monotonic() < deadline:
            time.sleep(0.2)
        # the shared daemon may also deliver alerts raised earlier (a key expiring soon) now that a webhook is set
        assert _budget_alerts(receiver), "the budget alert did not reach the webhook set in the console"
        assert all(receiver.signature_ok(headers, payload, SECRET) for headers, payload in receiver.received)
        assert json.loads(_budget_alerts(receiver)[0])["dimension"] == "tokens_per_day"

        row = _save(s, "queue_size", "32")
        assert "Saved: applies at the next restart." in row.inner_text()
        assert row.locator("[data-testid=pending-restart]").count() == 1
        s.shoot("settings-editing")

        viewer = signed_in("victor")
        viewer.goto("/settings")
        assert viewer.page.locator("[data-testid=setting-form]").count() == 0
        assert viewer.page.locator("[data-testid=restart-button]").count() == 0
        assert tiny in viewer.page.locator("tr[data-setting=default_model]").inner_text()
    finally:
        with console_daemon.admin() as admin:  # the daemon is shared: put things back
            admin.patch("/admin/settings/", json={"default_model": None, "alert_webhook_url": None, "queue_size": None})
        receiver.close()


def test_make_appliance_default_from_the_models_page(signed_in, console_daemon, tmp_path):
    tiny = _import_tiny(console_daemon, tmp_path, "tinyappliance")
    s = signed_in("alice")
    try:
        s.goto("/models")
        current = s.page.locator(f"#installed tr[data-model='{DEFAULT}']")
        assert current.locator("[data-testid=appliance-default]").count() == 1
        assert current.get_by_role("button", name="Make appliance default").count() == 0
        # without the CSRF token the form post is refused and nothing changes
        refused = s.page.request.post(console_daemon.url + "/models/appliance-default", form={"name": tiny})
        assert refused.status == 403

        asked: list[str] = []
        s.page.on("dialog", lambda dialog: asked.append(dialog.message))  # the session's own handler accepts it
        row = s.page.locator(f"#installed tr[data-model='{tiny}']")
        row.get_by_role("button", name="Make appliance default").click()
        s.page.wait_for_selector(f"#installed tr[data-model='{tiny}'] [data-testid=appliance-default]")
        assert len(asked) == 1 and tiny in asked[0] and f"The current default is {DEFAULT}." in asked[0]
        assert f"{tiny} is now the appliance's default model." in s.page.locator("#installed [data-feedback]").inner_text()
        assert s.page.locator(f"#installed tr[data-model='{DEFAULT}'] [data-testid=appliance-default]").count() == 0
        with console_daemon.admin() as admin:
            assert admin.get("/admin/aliases").json()["default"] == tiny
            answer = admin.post("/v1/completions", json={"model": "default", "prompt": "Hello", "max_tokens": 2})
            assert answer.status_code == 200 and answer.json()["model"] == tiny  # served at once, no restart
            rows = {r["name"]: r for r in admin.get("/admin/settings/").json()["settings"]}
            assert rows["default_model"]["value"] == tiny and rows["default_model"]["source"] == "config file"
        assert f'default_model = "{tiny}"' in console_daemon.config_file.read_text()
        s.goto("/audit")
        audit = s.page.locator("table").inner_text()
        assert "settings.change" in audit and f"'{DEFAULT}' -> '{tiny}' (live)" in audit

        for name in ("otto", "victor"):  # an operator or a viewer sees no such button, and is refused the form post
            other = signed_in(name)
            other.goto("/models")
            assert other.page.get_by_role("button", name="Make appliance default").count() == 0
            headers = {"X-CSRF-Token": other.csrf(), "HX-Request": "true"}
            posted = other.page.request.post(
                console_daemon.url + "/models/appliance-default", form={"name": DEFAULT}, headers=headers
            )
            assert posted.status == 403
        with console_daemon.admin() as admin:
            assert admin.get("/admin/aliases").json()["default"] == tiny
    finally:
        with console_daemon.admin() as admin:  # the daemon is shared: put things back
            admin.patch("/admin/settings/", json={"default_model": None})
