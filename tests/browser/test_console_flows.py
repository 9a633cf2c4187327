"""The console end to end, in headless Chromium against the real daemon.

Sign-in and the first-run password change; a key created in the console works
against the API and stops working the moment it is revoked; a pull from a local
HTTP server shows its progress bar reach 100%; the playground streams text from
the default model; a viewer sees no admin actions and is refused them.
"""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import _watch, sign_in
from tests.ggufkit import make_tiny_gguf

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HOSTILE_TEMPLATE = '{{ bos_token }}<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'


def test_first_run_forces_a_password_change(chromium, console_daemon):
    errors: list[str] = []
    context = chromium.new_context()
    page = context.new_page()
    _watch(page, errors)
    sign_in(page, console_daemon.url, "admin", console_daemon.initial_password)
    assert page.url.endswith("/password")
    page.goto(console_daemon.url + "/keys")  # every page sends the user back until the password is changed
    assert page.url.endswith("/password")
    page.fill("input[name=current]", console_daemon.initial_password)
    page.fill("input[name=new]", "a-brand-new-password")
    page.fill("input[name=confirm]", "a-brand-new-password")
    with page.expect_navigation():
        page.click("form[action='/password'] button[type=submit]")
    assert page.url.rstrip("/") == console_daemon.url
    assert page.locator("h1").inner_text() == "Overview"
    page.click("[data-testid=logout]")
    page.wait_for_url("**/login")
    sign_in(page, console_daemon.url, "admin", "a-brand-new-password")
    assert page.url.rstrip("/") == console_daemon.url
    context.close()
    assert not errors, errors


def test_key_created_in_the_console_works_until_revoked(signed_in, console_daemon):
    s = signed_in("alice")
    s.goto("/keys")
    s.page.fill("[data-testid=key-name]", "console-made")
    s.page.click("[data-testid=create-key]")
    secret = s.page.locator("[data-testid=new-secret]").inner_text().strip()
    assert secret.startswith("ak_")
    with httpx.Client(base_url=console_daemon.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as api:
        assert api.get("/v1/models").status_code == 200
        s.shoot("keys-created")
        # narrow the key to one model: the API lists only that one (and the alias pointing at it)
        edit = s.page.locator(f"tr[data-key='{secret[:12]}'] + tr.edit-row")
        edit.locator("summary").click()
        edit.locator("input[name=allowed_models][value='gemma-3-270m:q4_k_m']").check()
        edit.locator("button", has_text="Save access").click()
        s.page.wait_for_selector("#keys-area .alert-ok")
        ids = {m["id"] for m in api.get("/v1/models").json()["data"]}
        assert "gemma-3-270m:q4_k_m" in ids and all(i in ("gemma-3-270m:q4_k_m", "default") for i in ids), ids
        # a team with a quota
        s.page.fill("input[placeholder='e.g. research']", "research")
        s.page.locator("button", has_text="Create team").click()
        s.page.wait_for_selector("#keys-area td:has-text('research')")
        team = s.page.locator("section[aria-label=Teams] tr", has_text="research")
        team.locator("summary").click()
        team.locator("input[name=requests_per_minute]").fill("100")
        team.locator("button", has_text="Save quota").click()
        s.page.wait_for_selector("section[aria-label=Teams] .badge:has-text('requests per minute 100')")
        row = s.page.locator(f"tr[data-key='{secret[:12]}']")
        row.locator("button.danger").click()  # hx-confirm: the dialog is accepted
        s.page.wait_for_selector(f"tr[data-key='{secret[:12]}']", state="detached")
        assert api.get("/v1/models").status_code == 401
    s.goto("/audit")
    text = s.page.locator("table").inner_text()
    assert "key.create" in text and "key.revoke" in text and "user:alice" in text
    assert secret not in s.page.content()


class _SlowFile(http.server.BaseHTTPRequestHandler):
    path_on_disk: Path
    chunk = 16 * 1024
    pause = 0.04

    def do_GET(self) -> None:  # noqa: N802
        data = self.path_on_disk.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        for start in range(0, len(data), self.chunk):
            self.wfile.write(data[start : start + self.chunk])
            self.wfile.flush()
            time.sleep(self.pause)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def model_server(tmp_path):
    model = make_tiny_gguf(tmp_path / "tiny-hostile.Q8_0.gguf", vocab=2048, n_embd=128, chat_template=HOSTILE_TEMPLATE)
    handler = type("Handler", (_SlowFile,), {"path_on_disk": model})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{model.name}"
    server.shutdown()


def test_pull_shows_progress_to_100_percent(signed_in, model_server):
    s = signed_in("alice")
    s.goto("/models")
    s.page.fill("[data-testid=pull-url]", model_server)
    s.page.fill("[data-testid=pull-name]", "tiny-hostile:q8_0")
    s.page.click("[data-testid=pull-submit]")
    progress = s.page.locator("#jobs [data-testid=job-progress]").first
    progress.wait_for()
    seen = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen.add(int(progress.get_attribute("value") or 0))
        if 100 in seen:
            break
        s.page.wait_for_timeout(100)
    assert 100 in seen, seen
    assert len(seen) > 2, f"the bar jumped straight to the end: {sorted(seen)}"
    assert s.page.locator("#jobs [data-testid=job-percent]").first.inner_text() == "100%"
    s.page.wait_for_selector("#installed tr[data-model='tiny-hostile:q8_0']")
    # The file's chat template is shown as text, never run as markup.
    s.page.click("#installed tr[data-model='tiny-hostile:q8_0'] details summary")
    shown = s.page.locator("#installed tr[data-model='tiny-hostile:q8_0'] [data-testid=chat-template]").inner_text()
    assert "<script>" in shown and "onerror" in shown
    assert s.page.locator("#installed script, #installed img").count() == 0
    assert s.page.evaluate("window.__pwned === undefined")
    s.shoot("models-after-pull")


def test_playground_streams_text_from_the_default_model(signed_in):
    s = signed_in("otto")  # operators may use the playground
    s.goto("/playground")
    s.page.select_option("[data-testid=model]", "default")
    s.page.check("[data-testid=mode-completion]")
    s.page.fill("input[name=temperature]", "0")
    s.page.fill("[data-testid=max-tokens]", "24")
    s.page.fill("[data-testid=prompt]", "The three primary colours are")
    s.page.click("[data-testid=send]")
    text = s.page.locator("[data-testid=assistant-text]").last
    s.page.wait_for_function(
        "() => { const t = document.querySelectorAll('[data-testid=assistant-text]');"
        " return t.length && t[t.length - 1].textContent.trim().length > 0 }",
        timeout=120_000,
    )
    s.page.locator("[data-testid=usage-done]").last.wait_for(timeout=120_000)
    assert text.inner_text().strip()
    usage = s.page.locator("[data-testid=usage-line]").last.inner_text()
    assert "completion tokens" in usage and "cache" in usage
    s.shoot("playground", docs=True)


def test_viewer_sees_no_admin_actions_and_is_refused_them(signed_in, console_daemon):
    s = signed_in("victor")
    s.goto("/keys")
    assert s.page.locator("[data-testid=create-key], button.danger").count() == 0
    s.goto("/models")
    assert s.page.locator("#installed button").count() == 0
    assert s.page.locator("[data-testid=pull-submit]").count() == 0
    assert "Playground" not in s.page.locator("nav").inner_text()
    assert "Users" not in s.page.locator("nav").inner_text()
    token = s.csrf()
    for path, form in (
        ("/keys/create", {"name": "sneaky"}),
        ("/models/load", {"name": "default"}),
        ("/models/pull", {"url": "http://127.0.0.1:9/x.gguf"}),
        ("/users/create", {"username": "eve"}),
        ("/cache/purge", {}),
        ("/playground/send", {"model": "default", "prompt": "hi"}),
    ):
        response = s.page.request.post(console_daemon.url + path, form=form, headers={"X-CSRF-Token": token})
        assert response.status == 403, (path, response.status)
    assert s.page.request.get(console_daemon.url + "/playground").status == 403
    assert s.page.request.get(console_daemon.url + "/users").status == 403
