"""The playground while an answer streams, in headless Chromium against the real daemon (the default model).

Send (and Enter) wait while an answer streams and come back when it ends or is stopped; closing the page
mid-answer ends the request cleanly (abandoned in the ledger, no RuntimeError from closing the gateway's
stream); a cache replay says "cached" instead of a generation speed; durations read as people write them.
"""

from __future__ import annotations

import re
import sqlite3
import time

import pytest

from tests.daemon import RunningDaemon

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DURATION = r"(\d{1,3} ms|\d+\.\d s)"


def _ledger(daemon: RunningDaemon) -> list[tuple]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        return db.execute("SELECT request_id, status, completion_tokens FROM usage ORDER BY id").fetchall()


def _start_long_answer(page, prompt: str) -> None:
    page.select_option("[data-testid=model]", "default")
    page.check("[data-testid=mode-completion]")
    page.fill("input[name=temperature]", "0.9")
    page.fill("[data-testid=max-tokens]", "4000")
    page.fill("[data-testid=prompt]", prompt)
    page.click("[data-testid=send]")
    page.wait_for_function(
        "() => { const t = document.querySelector('[data-testid=assistant-text]'); return t && t.textContent.length > 20 }",
        timeout=120_000,
    )


def test_send_waits_while_an_answer_streams(signed_in):
    s = signed_in("otto")
    s.goto("/playground")
    _start_long_answer(s.page, "Ein sehr langer Bericht über das Meer, Kapitel eins:")
    send = s.page.locator("[data-testid=send]")
    assert send.is_disabled()
    s.page.fill("[data-testid=prompt]", "a second prompt while the first streams")
    s.page.locator("[data-testid=prompt]").press("Enter")
    s.page.wait_for_timeout(500)
    assert s.page.locator("[data-testid=assistant-turn]").count() == 1, "a second answer started while one streamed"
    s.page.click("[data-testid=stop]")
    s.page.locator("[data-testid=stopped]").wait_for(timeout=30_000)
    s.page.wait_for_function("() => !document.querySelector('[data-testid=send]').disabled", timeout=15_000)
    assert s.page.input_value("[data-testid=prompt]") == "a second prompt while the first streams"


def test_closing_the_page_mid_answer_ends_the_request_cleanly(chromium, console_daemon):
    from tests.browser.conftest import USERS, sign_in

    before_log, before = len(console_daemon.log()), {row[0] for row in _ledger(console_daemon)}
    context = chromium.new_context()
    page = context.new_page()
    sign_in(page, console_daemon.url, "otto", USERS["otto"][1])
    page.goto(console_daemon.url + "/playground")
    _start_long_answer(page, "Here is a very long story about a lighthouse keeper. Chapter one.")
    context.close()  # the browser leaves mid-answer
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (new := [r for r in _ledger(console_daemon) if r[0] not in before]):
        time.sleep(0.2)
    assert len(new) == 1 and new[0][1] == 499 and 0 < new[0][2] < 4000, new
    time.sleep(1.0)  # the relay's clean-up runs after the ledger row
    log = console_daemon.log()[before_log:]
    assert "already running" not in log and "RuntimeError" not in log and "Traceback" not in log, log[-3000:]


def test_a_cache_replay_says_cached_and_durations_read_well(signed_in):
    s = signed_in("otto")
    s.goto("/playground")
    s.page.select_option("[data-testid=model]", "default")
    s.page.check("[data-testid=mode-completion]")
    s.page.fill("input[name=temperature]", "0")
    s.page.fill("[data-testid=max-tokens]", "6")
    for turn in (1, 2):
        s.page.fill("[data-testid=prompt]", "Replay me: the seven seas are")
        s.page.wait_for_function("() => !document.querySelector('[data-testid=send]').disabled", timeout=60_000)
        s.page.click("[data-testid=send]")
        s.page.wait_for_function(
            f"() => document.querySelectorAll('[data-testid=usage-done]').length === {turn}", timeout=120_000
        )
    first, replay = s.page.locator("[data-testid=usage-line]").all_inner_texts()
    assert "tok/s" in first and "cached" not in first, first
    assert "· cache exact" in replay and "· cached" in replay and "tok/s" not in replay, replay
    for line in (first, replay):
        assert re.search(rf"TTFT {DURATION}", line), line
        assert re.search(rf"· {DURATION}\s*(·|$)", line), line
        assert not re.search(r"\d{4,} ms", line), line
