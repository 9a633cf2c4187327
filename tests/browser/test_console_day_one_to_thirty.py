"""Day one to day thirty in the console, in headless Chromium against one real daemon, with no CLI and no restart.

The daemon starts as a fresh install starts it: a bare data dir and an empty config file, so it makes ``admin`` and
writes its one-time password to ``initial-admin-password``, which the admin reads from the file. In the browser the
admin signs in with it and chooses a new password; imports two tiny models from files on the box; creates a team and
a key in it (the secret is shown once); the app calls the API with that key; the admin rotates the key, and both
secrets answer during the overlap; sets the alert webhook (secret, then URL, pointing at a real receiver) and the
default model on the Settings page, and both apply live: the Alerts page's "Send test" reaches the new URL, signed,
and ``model: default`` answers from the new model. With ``max_loaded_instances = 1``, loading the second tiny model
asks to evict the default one; the admin confirms, the evicted row names what replaced it and the overview flags the
default model as evicted. Last, a request with a wrong key is refused and found on the Requests page by the
x-request-id its client got. The daemon's pid is the same at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import WIDE, _watch, sign_in
from tests.daemon import RunningDaemon, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.webhookkit import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FIRST, SECOND = "dayone-first:f32", "dayone-second:f32"
NEW_PASSWORD = "day-one-admin-password"
SECRET = "day-one-webhook-secret"


@pytest.fixture(scope="module")
def fresh_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    base = tmp_path_factory.mktemp("day-one")
    config = base / "appliance.toml"  # installs ship a config file, where settings changed in the console are written
    config.write_text("# written by the installer\n")
    for seed, name in ((5, FIRST), (7, SECOND)):  # model files copied onto the box, imported from the console
        make_tiny_gguf(base / f"{name.split(':')[0]}.gguf", seed=seed, vocab=512, n_embd=64)
    box = start_daemon(base, APPLIANCE_CONFIG=str(config), APPLIANCE_MAX_LOADED_INSTANCES="1")
    yield box
    box.stop()


def _daemon_pid(box: RunningDaemon) -> int:
    assert box.proc is not None and box.proc.poll() is None, "the daemon is not running"
    return int((box.data_dir / "run" / "applianced.lock").read_text().strip())


def _api(base: str, secret: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300)


def _save_setting(page, name: str, value: str, *, select: bool = False) -> str:
    row = page.locator(f"tr[data-setting={name}]")
    field = row.locator("[data-testid=setting-value]")
    field.select_option(value) if select else field.fill(value)
    row.locator("[data-testid=setting-save]").click()
    done = ", ".join(f"tr[data-setting={name}] [data-testid=setting-{outcome}]" for outcome in ("saved", "error"))
    page.wait_for_selector(done)
    return page.locator(f"tr[data-setting={name}]").inner_text()


def _first_sign_in(page, box: RunningDaemon) -> None:
    one_time = (box.data_dir / "initial-admin-password").read_text().strip()  # read by the admin, as the installer says
    sign_in(page, box.url, "admin", one_time)
    assert page.url.endswith("/password"), page.url
    page.fill("input[name=current]", one_time)
    page.fill("input[name=new]", NEW_PASSWORD)
    page.fill("input[name=confirm]", NEW_PASSWORD)
    with page.expect_navigation():
        page.click("form[action='/password'] button[type=submit]")
    assert page.url.rstrip("/") == box.url and page.locator("h1").inner_text() == "Overview"


def _import_models(page, box: RunningDaemon) -> None:
    page.goto(box.url + "/models")
    form = "form[hx-post='/models/import']"
    for name in (FIRST, SECOND):
        page.fill(f"{form} input[name=path]", str(box.data_dir.parent / f"{name.split(':')[0]}.gguf"))
        page.fill(f"{form} input[name=name]", name)
        page.click(f"{form} button[type=submit]")
        page.wait_for_selector(f"#installed tr[data-model='{name}'] .badge.state-ready", timeout=120_000)


def _team_and_key(page, base: str) -> str:
    page.goto(base + "/keys")
    page.fill("form[hx-post='/teams/create'] input[name=name]", "support-bots")
    page.click("form[hx-post='/teams/create'] button[type=submit]")
    page.wait_for_selector("section[aria-label=Teams] tr[data-team='support-bots']")
    create = page.locator("form:has([data-testid=create-key])")
    create.locator("[data-testid=key-name]").fill("helpdesk-app")
    create.locator("select[name=team_id]").select_option(label="support-bots")
    create.locator("[data-testid=create-key]").click()
    secret = page.locator("[data-testid=new-secret]").inner_text().strip()
    assert secret.startswith("ak_")
    assert "support-bots" in page.locator(f"tr[data-key='{secret[:12]}']").inner_text()
    return secret


def _rotate(page, base: str, old_secret: str) -> str:
    page.goto(base + "/keys")  # the secret is not on the page any more
    assert old_secret not in page.content()
    edit = page.locator(f"tr[data-key='{old_secret[:12]}'] + tr.edit-row")
    edit.locator("summary").click()
    edit.locator("[data-testid=overlap-hours]").select_option("1")
    edit.locator("[data-testid=rotate-key]").click()  # its confirmation is accepted
    page.wait_for_selector("[data-testid=new-key] h2:has-text('rotated')")
    new_secret = page.locator("[data-testid=new-secret]").inner_text().strip()
    assert new_secret.startswith("ak_") and new_secret != old_secret
    assert "keeps working until" in page.locator("[data-testid=new-key]").inner_text()
    return new_secret


def test_day_one_setup_to_day_thirty_operations_in_the_console(chromium, fresh_install):
    box = fresh_install
    pid = _daemon_pid(box)
    receiver = Receiver()
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    _watch(page, errors)  # collects console errors and accepts every confirmation
    questions: list[str] = []
    page.on("dialog", lambda dialog: questions.append(dialog.message))
    try:
        # day one: the first sign-in, a team, a key the app uses
        _first_sign_in(page, box)
        _import_models(page, box)
        secret = _team_and_key(page, box.url)
        with _api(box.url, secret) as app:
            assert app.get("/v1/models").status_code == 200

        # a rotation: both secrets answer during the overlap
        rotated = _rotate(page, box.url, secret)
        assert len(questions) == 1 and questions[0].startswith(f"Give helpdesk-app ({secret[:12]}…) a new secret?"), questions
        for each in (secret, rotated):
            with _api(box.url, each) as app:
                assert app.get("/v1/models").status_code == 200

        # the webhook and the default model, changed live on the Settings page
        page.goto(box.url + "/settings")
        assert "Applied now." in _save_setting(page, "alert_webhook_secret", SECRET)
        assert "Applied now." in _save_setting(page, "alert_webhook_url", receiver.url)
        assert "Applied now." in _save_setting(page, "default_model", FIRST, select=True)
        written = Path(box.env["APPLIANCE_CONFIG"]).read_text()  # written to the config file, as installs keep it
        assert f'default_model = "{FIRST}"' in written and receiver.url in written
        page.goto(box.url + "/alerts")
        page.click("[data-testid=alert-test]")
        page.locator("[data-testid=alert-test-feedback]").filter(has_text="the webhook answered 204").wait_for(timeout=30_000)
        assert len(receiver.received) == 1, receiver.received
        headers, body = receiver.received[0]
        assert receiver.signature_ok(headers, body, SECRET) and json.loads(body)["type"] == "webhook.test"
        with _api(box.url, rotated) as app:
            answer = app.post("/v1/completions", json={"model": "default", "prompt": "Day thirty", "max_tokens": 2})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == FIRST  # the new default serves, with no restart
        with box.admin() as admin:
            assert {i["model"] for i in admin.get("/admin/instances").json()} == {FIRST}

        # one slot: loading the second model asks to evict the default one
        page.goto(box.url + "/models")
        load = page.locator(f"#installed tr[data-model='{SECOND}'] form[hx-post='/models/load']")
        assert load.get_attribute("data-evicts") == FIRST
        load.locator("button").click()
        evicted = page.locator(f"#installed tr[data-model='{FIRST}'] [data-testid=evicted-by]")
        evicted.wait_for(timeout=120_000)
        page.wait_for_selector(f"#installed tr[data-model='{SECOND}'] .badge.ok", timeout=120_000)
        assert len(questions) == 2 and f"it stops {FIRST} (0 requests in flight" in questions[1], questions
        assert re.fullmatch(rf"evicted \d\d:\d\d UTC to load {re.escape(SECOND)}", evicted.inner_text().strip())
        first_row = page.locator(f"#installed tr[data-model='{FIRST}']")
        assert first_row.locator("[data-testid=appliance-default]").count() == 1  # still the default, but not loaded:
        assert first_row.locator(".badge.ok").count() == 0  # no green badge on its row
        page.goto(box.url + "/")
        flag = page.locator("[data-testid=default-model-flag]")
        assert flag.get_attribute("data-state") == "evicted" and FIRST in flag.inner_text() and SECOND in flag.inner_text()

        # a refused request, found by the id its client got
        with _api(box.url, "ak_not-a-key-of-this-appliance") as stranger:
            chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
            refused = stranger.post("/v1/chat/completions", json=chat)
        assert refused.status_code == 401
        request_id = refused.headers["x-request-id"]
        page.goto(box.url + "/requests")
        page.fill("[data-testid=filter-request-id]", request_id)
        with page.expect_navigation():
            page.click("[data-testid=filter-apply]")
        row = page.locator("[data-testid=request-row]")
        assert row.count() == 1 and row.locator("[data-testid=request-id]").inner_text() == request_id
        assert row.locator("[data-testid=request-status]").inner_text() == "401"
        assert row.locator("[data-testid=request-reason]").inner_text() == "invalid_api_key"
    finally:
        context.close()
        receiver.close()
    assert not errors, errors
    assert _daemon_pid(box) == pid  # the same daemon throughout: no restart
