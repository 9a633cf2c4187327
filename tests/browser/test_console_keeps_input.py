"""Forms keep what the admin typed when the answer is an error, and the error takes the focus.

Headless Chromium against the real daemon: a pull refused at once (a bad sha256), a pull whose job fails
later (the URL answers 404), an import of a path that is not there, and the password form (a wrong current
password, two new ones that differ). The password form's error answer carries the message only: no
password is ever sent back in HTML, the browser keeps the fields as typed.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from tests.browser.conftest import WIDE, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REFUSED = "Failed to load resource: the server responded with a status of 4"


@pytest.fixture
def missing_model_server() -> Iterator[str]:
    class Missing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Missing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def tab(chromium, console_daemon):
    """``tab(username, password)``: a signed-in page; console errors other than the 4xx notes fail the test."""
    made = []

    def make(username: str, password: str):
        context = chromium.new_context(viewport={"width": WIDE, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not m.text.startswith(REFUSED) else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(page, console_daemon.url, username, password)
        made.append((context, errors))
        return page

    yield make
    for context, errors in made:
        context.close()
        assert not errors, errors


def _focused_alert(page, form: str) -> str:
    """The text of the alert beside ``form`` once it holds the focus."""
    alert = page.locator(f"{form} + .feedback [role=alert]")
    alert.wait_for(timeout=30_000)
    page.wait_for_function("() => document.activeElement && document.activeElement.matches('.feedback [role=alert]')")
    return alert.inner_text()


def _values(page, form: str) -> dict[str, str]:
    return page.evaluate(
        "(sel) => Object.fromEntries([...document.querySelectorAll(sel + ' input:not([type=hidden])')]"
        ".map(i => [i.name, i.value]))",
        form,
    )


def test_pull_and_import_keep_what_was_typed(tab, console_daemon, missing_model_server):
    from tests.browser.conftest import USERS

    page = tab("alice", USERS["alice"][1])
    page.goto(console_daemon.url + "/models")
    pull = "form[hx-post='/models/pull']"
    url = f"{missing_model_server}/models/Ünïcode%20Zoo-Q4_K_M.gguf"
    page.fill(f"{pull} input[name=url]", url)
    page.fill(f"{pull} input[name=name]", "kept-zoo:q4_k_m")
    page.fill(f"{pull} input[name=sha256]", "not-a-digest")
    page.click(f"{pull} button[type=submit]")
    assert "sha256" in _focused_alert(page, pull)
    assert _values(page, pull) == {"url": url, "name": "kept-zoo:q4_k_m", "sha256": "not-a-digest"}

    page.fill(f"{pull} input[name=sha256]", "")
    page.click(f"{pull} button[type=submit]")  # accepted: the job starts, then fails on the 404
    job = page.locator("[data-job]").filter(has_text="kept-zoo:q4_k_m").first
    job.filter(has_text="404").wait_for(timeout=60_000)
    assert _values(page, pull) == {"url": url, "name": "kept-zoo:q4_k_m", "sha256": ""}

    imp = "form[hx-post='/models/import']"
    path = "/srv/models/does not exist/" + "x" * 300 + ".gguf"
    page.fill(f"{imp} input[name=path]", path)
    page.fill(f"{imp} input[name=name]", "kept:import")
    page.click(f"{imp} button[type=submit]")
    _focused_alert(page, imp)
    assert _values(page, imp) == {"path": path, "name": "kept:import"}


def test_password_errors_keep_the_fields_and_never_echo_them(tab, console_daemon):
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    engine = make_engine(console_daemon.data_dir / "appliance.db")
    create_user(engine, "pia", "pia-password-original-1", role="viewer")
    engine.dispose()
    page = tab("pia", "pia-password-original-1")
    answers: list = []
    page.on("response", lambda r: answers.append(r) if r.url.endswith("/password") and r.request.method == "POST" else None)
    page.goto(console_daemon.url + "/password")
    form = "form[action='/password']"
    typed = {"current": "wrong-current-pässword", "new": "Lantern-über-harbour-77", "confirm": "Lantern-über-harbour-77"}
    for name, value in typed.items():
        page.fill(f"{form} input[name={name}]", value)
    page.click(f"{form} button[type=submit]")
    assert "current password is wrong" in _focused_alert(page, form)
    assert page.url.endswith("/password")
    assert _values(page, form) == typed

    page.fill(f"{form} input[name=current]", "pia-password-original-1")
    page.fill(f"{form} input[name=confirm]", "Lantern-über-harbour-78")
    page.click(f"{form} button[type=submit]")
    page.locator(f"{form} + .feedback [role=alert]", has_text="differ").wait_for(timeout=30_000)
    assert _values(page, form) == {**typed, "current": "pia-password-original-1", "confirm": "Lantern-über-harbour-78"}

    page.fill(f"{form} input[name=confirm]", typed["new"])
    page.click(f"{form} button[type=submit]")
    page.locator("[data-testid=password-done]").wait_for(timeout=30_000)
    assert _values(page, form) == {"current": "", "new": "", "confirm": ""}
    page.wait_for_timeout(300)
    assert len(answers) == 3
    for body in (answer.text() for answer in answers):
        assert "pia-password-original-1" not in body and "Lantern" not in body and "wrong-current" not in body
