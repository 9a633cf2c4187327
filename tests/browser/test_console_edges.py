"""The console's edges, in headless Chromium against the real daemon: feedback beside the control that
caused it, confirmations that do nothing when dismissed, cancelling and clearing jobs, deleting teams and
users, the keys table's limits and spend against /admin/usage, the skip link, focus after htmx swaps, and
wide tables at 390 px."""

from __future__ import annotations

import http.server
import sqlite3
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from appliance.webui.key_table import month_start
from tests.browser.conftest import NARROW, USERS, WIDE, sign_in
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _db(console_daemon) -> sqlite3.Connection:
    return sqlite3.connect(console_daemon.data_dir / "appliance.db")


def _count(console_daemon, sql: str, *args: object) -> int:
    with _db(console_daemon) as conn:
        return int(conn.execute(sql, args).fetchone()[0])


def _active_element(page) -> dict[str, str]:
    return page.evaluate(
        "() => { const a = document.activeElement; return {tag: a ? a.tagName : '', id: a ? a.id : '',"
        " cls: a ? a.className : '', text: a ? (a.textContent || '').trim().slice(0, 80) : ''} }"
    )


def _feedback_beside(page, control_selector: str, text: str) -> None:
    """The message ``text`` is in a live region right after ``control_selector``, and inside the viewport."""
    slot = page.locator(f"{control_selector} + .feedback")
    slot.filter(has_text=text).wait_for(timeout=30_000)
    assert slot.get_attribute("role") == "status" and slot.get_attribute("aria-live") == "polite"
    box, form = slot.bounding_box(), page.locator(control_selector).bounding_box()
    height = page.viewport_size["height"]
    assert box and box["y"] >= 0 and box["y"] + box["height"] <= height, (box, height)
    assert 0 <= box["y"] - (form["y"] + form["height"]) < 40, (box, form)
    assert page.locator("#errors").inner_text().strip() == ""  # nothing at the top of the page


REFUSED = "Failed to load resource: the server responded with a status of 4"  # what Chromium logs for a 4xx answer


class Tab:
    """A signed-in page that accepts or dismisses every confirmation and remembers the questions. Console
    errors fail the test, except Chromium's note on the 4xx answers a test provokes on purpose (a refusal
    shown beside its control), which are counted instead."""

    def __init__(self, chromium, console_daemon, username: str = "alice", *, confirm: bool = True):
        self.context = chromium.new_context(viewport={"width": WIDE, "height": 900})
        self.page = self.context.new_page()
        self.confirm = confirm
        self.questions: list[str] = []
        self.errors: list[str] = []
        self.refusals = 0
        self.page.on("dialog", self._answer)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.base = console_daemon.url
        sign_in(self.page, self.base, username, USERS[username][1])

    def _console(self, message) -> None:
        if message.type != "error":
            return
        if message.text.startswith(REFUSED):
            self.refusals += 1
        else:
            self.errors.append(message.text)

    def _answer(self, dialog) -> None:
        self.questions.append(dialog.message)
        dialog.accept() if self.confirm else dialog.dismiss()

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")

    def csrf(self) -> str:
        return self.page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")

    def ask(self, selector: str) -> str:
        """Click ``selector``; return the confirmation it asked."""
        before = len(self.questions)
        self.page.click(selector)
        deadline = time.monotonic() + 10
        while len(self.questions) == before and time.monotonic() < deadline:
            self.page.wait_for_timeout(50)
        assert len(self.questions) == before + 1, f"{selector} asked nothing"
        self.page.wait_for_timeout(300)  # a request would have been sent by now
        return self.questions[-1]


@pytest.fixture
def tabs(chromium, console_daemon):
    """``tabs(confirm=True, refusals=0)``: a signed-in :class:`Tab`; at the end, no console errors and exactly
    the expected number of refused requests."""
    made: list[tuple[Tab, int]] = []

    def make(*, confirm: bool = True, refusals: int = 0) -> Tab:
        made.append((Tab(chromium, console_daemon, confirm=confirm), refusals))
        return made[-1][0]

    yield make
    for tab, expected in made:
        tab.context.close()
        assert not tab.errors, tab.errors
        assert tab.refusals == expected, (tab.refusals, expected)


@pytest.fixture
def slow_model_server(tmp_path) -> Iterator[str]:
    model = make_tiny_gguf(tmp_path / "tiny-slow.Q8_0.gguf", vocab=2048, n_embd=128)

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            data = model.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for start in range(0, len(data), 4096):
                    self.wfile.write(data[start : start + 4096])
                    self.wfile.flush()
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{model.name}"
    server.shutdown()


def test_feedback_appears_next_to_its_form_in_a_live_region(tabs):
    s = tabs(refusals=2)
    s.goto("/keys")
    team_form = "form[hx-post='/teams/create']"
    s.page.fill(f"{team_form} input[name=name]", "not a valid name!")
    s.page.click(f"{team_form} button[type=submit]")
    _feedback_beside(s.page, team_form, "Team names are 1 to 64 letters")
    assert s.page.locator(f"{team_form} + .feedback [role=alert]").count() == 1
    s.page.fill(f"{team_form} input[name=name]", "edges-feedback")
    s.page.click(f"{team_form} button[type=submit]")
    _feedback_beside(s.page, team_form, "Team edges-feedback created.")
    # the same at 390 px, for a control inside a collapsed row: the row opens again to show its message
    s.page.set_viewport_size({"width": NARROW, "height": 800})
    team = s.page.locator("tr[data-team='edges-feedback']")
    team.locator("summary").click()
    team.locator("input[name=tokens_per_day]").fill("lots")
    team.locator("button", has_text="Save quota").click()
    _feedback_beside(s.page, "tr[data-team='edges-feedback'] form[hx-post='/quotas/team:edges-feedback']", "must be a number")
    team.locator("input[name=tokens_per_day]").fill("5000")
    team.locator("button", has_text="Save quota").click()
    _feedback_beside(
        s.page,
        "tr[data-team='edges-feedback'] form[hx-post='/quotas/team:edges-feedback']",
        "Quota of team:edges-feedback saved.",
    )


def test_each_disruptive_action_asks_first_and_does_nothing_when_dismissed(tabs, console_daemon):
    d = tabs(confirm=False)
    secret = console_daemon.create_key("edges-revoke")
    with console_daemon.admin() as admin:
        admin.post("/admin/teams", json={"name": "edges-keep"}).raise_for_status()
        admin.post("/admin/users/", json={"username": "edges-victim", "password": "edges-victim-password-1"}).raise_for_status()
    d.goto("/keys")
    question = d.ask(f"[data-testid=revoke-{secret[:12]}]")
    assert "Revoke edges-revoke" in question and "401" in question
    assert d.ask("[data-testid=delete-team-edges-keep]").startswith("Delete team edges-keep?")
    d.goto("/users")
    row = "tr[data-user='edges-victim']"
    d.page.select_option(f"{row} select[name=role]", "admin")
    d.page.wait_for_timeout(300)
    assert d.questions[-1].startswith("Make edges-victim an admin?")
    assert d.page.locator(f"{row} select[name=role]").input_value() == "viewer"  # put back
    assert "Disable edges-victim?" in d.ask("[data-testid=disable-edges-victim]")
    assert "Delete edges-victim?" in d.ask("[data-testid=delete-edges-victim]")
    d.goto("/cache")
    assert d.ask("#cache-area button.danger").startswith("Purge the cached responses?")
    with httpx.Client(base_url=console_daemon.url, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as api:
        assert api.get("/v1/models").status_code == 200  # not revoked
        # unloading while a request streams says how many are in flight
        done, stop = threading.Event(), threading.Event()

        def stream() -> None:
            with api.stream(
                "POST",
                "/v1/completions",
                json={"model": "default", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True},
            ) as response:
                for _line in response.iter_lines():
                    done.set()
                    if stop.is_set():  # the client goes away mid-answer: the request ends there
                        break

        worker = threading.Thread(target=stream)
        worker.start()
        assert done.wait(180), "the stream never started"
        d.goto("/models")
        question = d.ask("#installed form[hx-post='/models/unload'] button")
        assert "1 request is in flight" in question, question
        assert d.page.locator("#installed .badge.ok", has_text="loaded").count() >= 1
        stop.set()
        worker.join(120)
        assert not worker.is_alive(), "the stream did not end when its client left"
    wait_until(lambda: _idle(console_daemon), 120, 0.2, "no request in flight")
    d.goto("/models")
    unloaded_name = d.page.locator("#installed tr:has(.badge.ok) strong").first.inner_text()
    d.page.locator(
        f"#installed tr[data-model='{unloaded_name}'] form[hx-post='/models/unload'] button"
    ).click()  # idle: no question
    d.page.wait_for_selector(f"#installed tr[data-model='{unloaded_name}'] form[hx-post='/models/load']")
    d.goto("/models")
    assert "Delete" in d.ask(f"#installed tr[data-model='{unloaded_name}'] form[hx-post='/models/delete'] button")
    assert len(d.questions) == 8
    assert _count(console_daemon, "SELECT count(*) FROM api_keys WHERE prefix = ? AND revoked_at IS NULL", secret[:12]) == 1
    assert _count(console_daemon, "SELECT count(*) FROM teams WHERE name = 'edges-keep' AND deleted_at IS NULL") == 1
    assert (
        _count(console_daemon, "SELECT count(*) FROM users WHERE username = 'edges-victim' AND role = 'viewer' AND NOT disabled")
        == 1
    )
    assert _count(console_daemon, "SELECT count(*) FROM audit_log WHERE action IN ('cache.purge', 'model.delete')") == 0
    d.goto("/models")
    assert d.page.locator(f"#installed tr[data-model='{unloaded_name}']").count() == 1


def _idle(console_daemon) -> bool:
    with console_daemon.admin() as admin:
        return all(i["inflight"] == 0 and i["waiting"] == 0 for i in admin.get("/admin/instances").json())


def _start_slow_pull(s, url: str, name: str):
    """Start pulling ``url`` as ``name`` from the models page; return its job card once bytes are arriving."""
    s.goto("/models")
    s.page.fill("[data-testid=pull-url]", url)
    s.page.fill("[data-testid=pull-name]", name)
    s.page.click("[data-testid=pull-submit]")
    job = s.page.locator("#jobs .job-wrap").first
    job.locator("button", has_text="Cancel").wait_for(timeout=30_000)
    s.page.wait_for_function(
        "() => { const p = document.querySelector('#jobs [data-testid=job-progress]'); return p && Number(p.value) > 0 }",
        timeout=60_000,
    )
    return job


def _acknowledgement(s, job):
    """The job card's own live region for the answer to Cancel, outside the parts the progress stream replaces."""
    ack = s.page.locator(f"#job-{job.get_attribute('data-job')}-feedback")
    assert ack.get_attribute("role") == "status" and ack.get_attribute("aria-live") == "polite"
    return ack


def test_cancel_a_running_pull_and_clear_finished_jobs(signed_in, console_daemon, slow_model_server):
    s = signed_in("alice")
    job = _start_slow_pull(s, slow_model_server, "tiny-slow:q8_0")
    ack = _acknowledgement(s, job)
    cancel = job.locator("button", has_text="Cancel")
    cancel.click()
    job.locator(".badge.state-cancelled").wait_for(timeout=30_000)
    # the acknowledgement stays in the card after the live update has shown the job cancelled
    ack.filter(has_text="Cancelling the pull of tiny-slow:q8_0").wait_for(timeout=30_000)
    assert "Cancelling the pull of tiny-slow:q8_0" in job.inner_text()
    assert cancel.count() == 0
    assert _active_element(s.page)["tag"] != "BODY"
    s.goto("/models")
    assert s.page.locator("#installed tr[data-model='tiny-slow:q8_0'] .badge.state-ready").count() == 0  # never installed
    assert _count(console_daemon, "SELECT count(*) FROM audit_log WHERE action = 'job.cancel' AND target = 'tiny-slow:q8_0'") == 1
    finished = s.page.locator("#jobs .job").count()
    assert finished >= 1 and s.page.locator("#jobs .badge.state-cancelled").count() >= 1
    s.page.click("[data-testid=clear-jobs]")
    s.page.locator("#jobs-area .feedback", has_text="finished job").wait_for()
    assert s.page.locator("#jobs .job").count() == 0
    s.goto("/models")
    assert s.page.locator("#jobs .job").count() == 0


def test_a_cancel_answered_after_the_live_update_ended_the_job_is_still_acknowledged(
    signed_in, console_daemon, slow_model_server
):
    """The race that made the acknowledgement vanish: the answer to Cancel is held back until the progress
    stream has shown the job cancelled (a slow network), and still shows in the card."""
    s = signed_in("alice")
    job = _start_slow_pull(s, slow_model_server, "tiny-late:q8_0")
    ack = _acknowledgement(s, job)
    held = []
    s.page.route("**/jobs/*/cancel", lambda route: held.append((route, route.fetch())))  # the daemon cancels now
    job.locator("button", has_text="Cancel").click()
    job.locator(".badge.state-cancelled").wait_for(timeout=30_000)
    assert len(held) == 1 and ack.inner_text().strip() == ""
    route, answer = held[0]
    route.fulfill(response=answer)
    ack.filter(has_text="Cancelling the pull of tiny-late:q8_0").wait_for(timeout=30_000)
    assert _active_element(s.page)["tag"] != "BODY"
    assert _count(console_daemon, "SELECT count(*) FROM audit_log WHERE action = 'job.cancel' AND target = 'tiny-late:q8_0'") == 1


def test_delete_a_team_and_a_user_but_never_oneself(tabs, console_daemon):
    s = tabs(refusals=1)
    s.goto("/keys")
    s.page.fill("form[hx-post='/teams/create'] input[name=name]", "edges-gone")
    s.page.click("form[hx-post='/teams/create'] button[type=submit]")
    s.page.wait_for_selector("tr[data-team='edges-gone']")
    with console_daemon.admin() as admin:
        team_id = next(t["id"] for t in admin.get("/admin/teams").json() if t["name"] == "edges-gone")
        key = admin.post("/admin/keys/", json={"name": "edges-team-key", "team_id": team_id}).json()
    s.goto("/keys")
    s.page.click("[data-testid=delete-team-edges-gone]")  # the confirmation is accepted
    _feedback_beside(
        s.page,
        "tr[data-team='edges-gone'] form[hx-post='/teams/edges-gone/delete']",
        "still has 1 active key; revoke them or move them to another team first",
    )
    s.page.click(f"[data-testid=revoke-{key['prefix']}]")
    s.page.wait_for_selector(f"tr[data-key='{key['prefix']}']", state="detached")
    s.page.click("[data-testid=delete-team-edges-gone]")
    s.page.wait_for_selector("tr[data-team='edges-gone']", state="detached")
    s.page.locator("section[aria-label=Teams] .feedback", has_text="Team edges-gone deleted").wait_for()
    assert (
        _count(console_daemon, "SELECT count(*) FROM audit_log WHERE action = 'team.delete' AND target = 'team:edges-gone'") == 1
    )

    s.goto("/users")
    s.page.fill("form[hx-post='/users/create'] input[name=username]", "edges-temp")
    s.page.click("form[hx-post='/users/create'] button[type=submit]")
    s.page.wait_for_selector("tr[data-user='edges-temp']")
    s.page.click("[data-testid=delete-edges-temp]")
    s.page.wait_for_selector("tr[data-user='edges-temp']", state="detached")
    s.page.locator("#users-area .feedback", has_text="edges-temp deleted").wait_for()
    assert _count(console_daemon, "SELECT count(*) FROM audit_log WHERE action = 'user.delete' AND target = 'edges-temp'") == 1
    # no Delete for oneself; a request made anyway (a stale or crafted page) is refused with the reason
    assert s.page.locator("tr[data-user='alice'] button").count() == 0
    my_id = _count(console_daemon, "SELECT id FROM users WHERE username = 'alice'")
    refused = s.page.request.post(
        f"{console_daemon.url}/users/{my_id}/delete", headers={"X-CSRF-Token": s.csrf(), "HX-Request": "true"}
    )
    assert refused.status == 409 and "You cannot delete yourself; ask another admin." in refused.text()
    assert _count(console_daemon, "SELECT count(*) FROM users WHERE username = 'alice'") == 1


def test_keys_table_shows_limits_and_spend_matching_admin_usage(signed_in, console_daemon):
    secret = console_daemon.create_key("edges-spend")
    prefix = secret[:12]
    with console_daemon.admin() as admin:
        admin.put("/admin/prices/*", json={"input_per_m": 2.0, "output_per_m": 6.0}).raise_for_status()
        admin.put(f"/admin/quotas/key:{prefix}", json={"tokens_per_month": 50_000, "cost_per_month": 3}).raise_for_status()
    with console_daemon.client(secret) as api:
        for prompt in ("The sky is", "Water boils at"):
            assert (
                api.post(
                    "/v1/completions", json={"model": "default", "prompt": prompt, "max_tokens": 8, "temperature": 0.7}
                ).status_code
                == 200
            )
    with console_daemon.admin() as admin:
        report = admin.get("/admin/usage", params={"by": "key", "since": str(month_start())}).json()
    row = next(r for r in report["rows"] if r["key"] == prefix)
    s = signed_in("alice")
    s.goto("/keys")
    cell = s.page.locator(f"tr[data-key='{prefix}'] [data-testid=spend]")
    assert int(cell.get_attribute("data-tokens")) == row["total_tokens"] > 0
    assert float(cell.get_attribute("data-cost")) == pytest.approx(row["cost"], abs=1e-6) and row["cost"] > 0
    text = cell.inner_text()
    assert "USD" in text and "left" in text and f"{row['requests']} requests" in text
    limits = s.page.locator(f"tr[data-key='{prefix}'] [data-testid=limits]").inner_text()
    assert f"tokens per month 50,000 · {row['total_tokens']:,} used" in limits and "cost per month 3.00 USD" in limits
    s.shoot("keys-spend")


def test_skip_link_focus_after_swaps_and_narrow_tables(signed_in, console_daemon):
    s = signed_in("alice")
    console_daemon.create_key("edges-narrow")
    s.goto("/keys")
    s.page.keyboard.press("Tab")
    first = _active_element(s.page)
    assert first["cls"] == "skip-link" and first["text"] == "Skip to main content"
    s.page.keyboard.press("Enter")
    assert _active_element(s.page)["id"] == "main"
    # submitting with the keyboard: the area is re-rendered, focus comes back to the same control
    field = "form[hx-post='/teams/create'] input[name=name]"
    s.page.fill(field, "edges-focus")
    s.page.focus(field)
    s.page.keyboard.press("Enter")
    s.page.wait_for_selector("tr[data-team='edges-focus']")
    s.page.wait_for_timeout(200)
    after = s.page.evaluate(
        "() => { const a = document.activeElement; return a && a.matches(\"form[hx-post='/teams/create'] input[name=name]\") }"
    )
    assert after, _active_element(s.page)
    # a control that is gone after the swap (the deleted team's button): focus goes to the message, not <body>
    s.page.focus("[data-testid=delete-team-edges-focus]")
    s.page.keyboard.press("Enter")
    s.page.wait_for_selector("tr[data-team='edges-focus']", state="detached")
    s.page.wait_for_timeout(200)
    focused = _active_element(s.page)
    assert focused["tag"] != "BODY" and "deleted" in focused["text"], focused
    # at 390 px the keys table scrolls inside its box, says so, and scrolling it brings Revoke on screen
    s.page.set_viewport_size({"width": NARROW, "height": 800})
    s.page.wait_for_timeout(200)
    wrap = s.page.locator("section[aria-label='API keys'] .table-wrap")
    assert "scrollable" in (wrap.get_attribute("class") or "") and wrap.get_attribute("tabindex") == "0"
    hint = s.page.evaluate(
        "() => getComputedStyle(document.querySelector(\"section[aria-label='API keys'] .table-wrap\"), '::before').content"
    )
    assert "Scroll sideways" in hint
    revoke = s.page.locator("section[aria-label='API keys'] button", has_text="Revoke").first
    wrap.evaluate("w => { w.scrollLeft = w.scrollWidth; }")
    box = revoke.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= NARROW, box
    assert s.page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
