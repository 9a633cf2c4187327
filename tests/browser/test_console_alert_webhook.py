"""The Alerts page's "Send test" in headless Chromium against a daemon whose alert webhook is a real receiver on
loopback: the test event arrives signed as alerts are, the page shows what the webhook answered (its status, or why
it could not be reached), and each test is audited."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest

from tests.browser.conftest import USERS, WIDE, sign_in
from tests.daemon import RunningDaemon, start_daemon
from tests.webhookkit import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SECRET = "webhook-secret-for-the-console-test"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def alerting_daemon(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[RunningDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    running = start_daemon(
        tmp_path_factory.mktemp("alerting"), APPLIANCE_ALERT_WEBHOOK_URL=receiver.url, APPLIANCE_ALERT_WEBHOOK_SECRET=SECRET
    )
    engine = make_engine(running.data_dir / "appliance.db")
    for name in ("alice", "victor"):
        create_user(engine, name, USERS[name][1], role=USERS[name][0])
    engine.dispose()
    yield running
    running.stop()


def _page(chromium, daemon: RunningDaemon, username: str):
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    sign_in(page, daemon.url, username, USERS[username][1])
    page.goto(daemon.url + "/alerts")
    return context, page, errors


def _audited(daemon: RunningDaemon) -> list[tuple[str, str]]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as conn:
        return conn.execute("SELECT actor, detail FROM audit_log WHERE action = 'alert.webhook_test' ORDER BY id").fetchall()


def test_send_test_shows_what_the_webhook_answered(chromium, alerting_daemon, receiver):
    context, page, errors = _page(chromium, alerting_daemon, "alice")
    try:
        feedback = page.locator("[data-testid=alert-test-feedback]")
        assert feedback.get_attribute("role") == "status" and feedback.get_attribute("aria-live") == "polite"
        page.click("[data-testid=alert-test]")
        feedback.filter(has_text="the webhook answered 204").wait_for(timeout=30_000)
        assert len(receiver.received) == 1
        headers, body = receiver.received[0]
        assert receiver.signature_ok(headers, body, SECRET)
        assert json.loads(body)["type"] == "webhook.test"

        receiver.status = 500
        page.click("[data-testid=alert-test]")
        feedback.filter(has_text="the webhook answered 500").wait_for(timeout=30_000)
        assert "alert-error" in feedback.inner_html()

        receiver.close()  # nothing listens any more
        page.click("[data-testid=alert-test]")
        feedback.filter(has_text="could not reach the webhook").wait_for(timeout=30_000)
        assert errors == []
    finally:
        context.close()
    audited = _audited(alerting_daemon)
    assert [actor for actor, _ in audited] == ["user:alice"] * 3
    assert audited[0][1] == "status=204" and audited[1][1] == "status=500" and "could not reach" in audited[2][1]


def test_only_admins_send_tests(chromium, alerting_daemon):
    context, page, _ = _page(chromium, alerting_daemon, "victor")
    try:
        assert page.locator("[data-testid=alert-test]").count() == 0
        csrf = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
        answer = page.request.post(alerting_daemon.url + "/alerts/test", headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
        assert answer.status == 403
    finally:
        context.close()
