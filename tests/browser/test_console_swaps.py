"""What an admin meets after htmx swaps and on a phone, in headless Chromium against the real daemon: no
Content-Security-Policy violation across swaps, focus that lands on the result of Load and of a role change,
and action columns that never cover the other columns of a table at 390 px."""

from __future__ import annotations

import pytest

from tests.browser.conftest import NARROW, Session
from tests.browser.test_console_models_live import CHAT_MODEL, _open, _row, _unload, browser_session, models
from tests.daemon import RunningDaemon

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser_session", "models"]  # fixtures shared with the live models tests

RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(e.effectiveDirective + " " + e.blockedURI + " " + (e.sample || ""));
});
"""

FOCUSED = """() => { const a = document.activeElement; if (!a || a === document.body) return null;
  const live = a.closest("[aria-live]"); const row = a.closest("tr");
  return {tag: a.tagName, text: (a.textContent || "").trim(), live: live ? live.getAttribute("aria-live") : null,
          role: a.getAttribute("role"), row: row ? (row.dataset.model || row.dataset.user || "") : null,
          name: a.getAttribute("name")}; }"""

# Every cell of a row that shares screen space with the row's action cell, as rectangles.
ACTION_OVERLAPS = """() => { const out = [];
  document.querySelectorAll("td.actions").forEach((actions) => {
    const a = actions.getBoundingClientRect();
    for (const cell of actions.parentElement.children) {
      if (cell === actions) continue;
      const b = cell.getBoundingClientRect();
      if (b.right > a.left + 0.5 && b.left < a.right - 0.5 && b.bottom > a.top + 0.5 && b.top < a.bottom - 0.5)
        out.push((cell.textContent || "").trim().slice(0, 30) + " under " + (actions.textContent || "").trim().slice(0, 30));
    }
  });
  return out; }"""


def _violations(s: Session) -> list[str]:
    return s.page.evaluate("window.__violations")


def _swap(s: Session, action, path: str) -> None:
    with s.page.expect_response(lambda r: path in r.url and r.request.headers.get("hx-request") == "true"):
        action()
    s.page.wait_for_load_state("networkidle")
    s.page.wait_for_timeout(200)  # htmx settles 20 ms after the swap


def test_no_style_is_blocked_across_swaps(browser_session, models: RunningDaemon):
    with models.admin() as admin:
        admin.post("/admin/users/", json={"username": "swap-csp", "password": "swap-csp-password-1"})
    s = browser_session("alice")
    s.page.add_init_script(RECORD_VIOLATIONS)
    _open(s, "/usage")
    # a control the browser gave an inline style (as a resized field or a browser extension does, through the
    # CSSOM, which the policy allows); the swap brings a new copy of the control with the same id
    s.page.evaluate("document.getElementById('filter-team').style.minWidth = '12em'")
    _swap(s, lambda: s.page.select_option("[data-testid=filter-range]", "7d"), "/usage")
    _swap(s, lambda: s.page.select_option("[data-testid=filter-range]", "today"), "/usage")
    _open(s, "/users")
    _swap(s, lambda: s.page.select_option("tr[data-user='swap-csp'] select[name=role]", "operator"), "/role")
    _open(s, "/")
    s.page.wait_for_timeout(5_500)  # one live update of the overview
    assert _violations(s) == []
    s.shoot("overview-after-swaps")


def test_focus_lands_on_the_result_of_a_load(browser_session, models: RunningDaemon):
    _unload(models, CHAT_MODEL)
    s = browser_session("otto")
    _open(s, "/models", streams=1)
    row = _row(CHAT_MODEL)
    s.page.focus(f"{row} form[hx-post='/models/load'] button")
    s.page.keyboard.press("Enter")  # the button is disabled while the load runs, which took the focus away
    s.page.wait_for_selector(f"{row} [data-testid=load-status][data-phase=loaded]", timeout=60_000)
    s.page.wait_for_function(f"() => (document.activeElement.textContent || '').includes('Loaded {CHAT_MODEL}')", timeout=5_000)
    focused = s.page.evaluate(FOCUSED)
    assert focused and focused["row"] == CHAT_MODEL and focused["live"] == "polite" and focused["role"] == "status", focused


def test_focus_stays_in_the_row_of_a_role_change(browser_session, models: RunningDaemon):
    with models.admin() as admin:
        admin.post("/admin/users/", json={"username": "swap-role", "password": "swap-role-password-1"})
    s = browser_session("alice")
    _open(s, "/users")
    select = "tr[data-user='swap-role'] select[name=role]"
    s.page.focus(select)
    current = s.page.locator(select).input_value()
    _swap(s, lambda: s.page.keyboard.press("ArrowUp" if current != "admin" else "ArrowDown"), "/role")
    message = s.page.locator("tr[data-user='swap-role'] .feedback[role=status][aria-live=polite]")
    message.filter(has_text="swap-role is now").wait_for(timeout=5_000)
    focused = s.page.evaluate(FOCUSED)
    assert focused and focused["row"] == "swap-role" and focused["name"] == "role", focused


@pytest.mark.parametrize("path", ["/users", "/keys", "/models"])
def test_action_columns_cover_nothing_at_390_px(browser_session, models: RunningDaemon, path: str):
    models.create_key("swap-narrow")
    s = browser_session("alice")
    s.page.set_viewport_size({"width": NARROW, "height": 800})
    _open(s, path)
    s.page.wait_for_timeout(200)
    assert s.page.locator("td.actions").count() > 0
    assert s.page.evaluate(ACTION_OVERLAPS) == []
    # the table scrolls sideways inside its box, so its last column (the actions) can be brought on screen
    wrap = s.page.locator("td.actions").first.locator("xpath=ancestor::div[contains(@class, 'table-wrap')]")
    wrap.evaluate("w => { w.scrollLeft = w.scrollWidth; }")
    s.page.wait_for_timeout(100)
    assert s.page.evaluate(ACTION_OVERLAPS) == []
    button = s.page.locator("td.actions button").first.bounding_box()
    assert button and button["x"] >= 0 and button["x"] + button["width"] <= NARROW, button
    assert s.page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
