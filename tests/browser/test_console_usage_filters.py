"""The usage page in headless Chromium: filters applied through htmx change the figures, the
charts and the tables, live in the address bar, and the back button restores the view before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _ask(base: str, secret: str, content: str) -> dict:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 5, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        return response.json()["usage"]


def _figure(page, testid: str) -> int:
    return int(page.locator(f"#usage-report [data-testid={testid}]").first.inner_text().split()[0])


def _chart_numbers(page, chart: str) -> list[str]:
    return page.locator(f"[data-testid={chart}-table] td").all_inner_texts()


def _swapped(page, action, address: str) -> None:
    """Run ``action``; wait for htmx to swap the report and push ``address`` (a query fragment) to the address bar."""
    with page.expect_response(lambda r: "/usage" in r.url and r.request.headers.get("hx-request") == "true"):
        action()
    page.wait_for_function("part => location.search.includes(part)", arg=address)
    page.wait_for_load_state("networkidle")


def _back(page, address: str) -> None:
    """Go back; htmx fetches the earlier address again (it keeps no history cache) and restores the page."""
    with page.expect_response(lambda r: r.request.headers.get("hx-history-restore-request") == "true"):
        page.go_back()
    page.wait_for_function("part => location.search.includes(part)", arg=address)
    page.wait_for_load_state("networkidle")
    page.wait_for_selector("#usage-report [data-testid=total-requests]")


def _pick_date(page, testid: str, value: str):
    def pick() -> None:
        page.fill(f"[data-testid={testid}]", value)
        page.locator(f"[data-testid={testid}]").dispatch_event("change")

    return pick


def test_filters_change_figures_charts_and_address_and_back_restores(signed_in, console_daemon):
    with console_daemon.admin() as admin:
        teams = {n: admin.post("/admin/teams", json={"name": n}).json()["id"] for n in ("usage-ui-red", "usage-ui-blue")}
        keys = {n: admin.post("/admin/keys/", json={"name": n, "team_id": t}).json() for n, t in teams.items()}
    red = [_ask(console_daemon.url, keys["usage-ui-red"]["secret"], f"Say the word {w}.") for w in ("red", "rose")]
    blue = [_ask(console_daemon.url, keys["usage-ui-blue"]["secret"], "Say the word blue.")]

    s = signed_in("victor")  # a viewer may read usage
    s.goto("/usage")
    page = s.page
    assert _figure(page, "total-requests") >= 3
    assert page.locator("#chart-tokens-t").text_content().startswith("Tokens in and out per")
    unfiltered_chart = _chart_numbers(page, "chart-tokens")

    def pick_red() -> None:
        page.focus("[data-testid=filter-team]")
        page.select_option("[data-testid=filter-team]", "usage-ui-red")

    _swapped(page, pick_red, "team=usage-ui-red")
    assert _figure(page, "total-requests") == 2
    assert page.evaluate("document.activeElement.id") == "filter-team"  # focus stays on the control just changed
    assert _figure(page, "total-prompt") == sum(u["prompt_tokens"] for u in red)
    assert _figure(page, "total-completion") == sum(u["completion_tokens"] for u in red)
    red_chart = _chart_numbers(page, "chart-tokens")
    assert red_chart != unfiltered_chart
    assert sum(int(v.replace(",", "")) for v in red_chart if v != "–") == sum(
        u["prompt_tokens"] + u["completion_tokens"] for u in red
    )
    assert page.locator("[data-testid=by-team] tbody tr").all_inner_texts()[0].startswith("usage-ui-red")

    _swapped(page, lambda: page.select_option("[data-testid=filter-team]", "usage-ui-blue"), "team=usage-ui-blue")
    assert _figure(page, "total-requests") == 1 and _figure(page, "total-tokens") == blue[0]["total_tokens"]

    _swapped(page, lambda: page.select_option("[data-testid=filter-range]", "today"), "range=today")
    assert _figure(page, "total-requests") == 1
    assert len(page.locator("[data-testid=chart-requests-table] tbody tr").all()) == 24  # one day: by the hour

    today = datetime.now(UTC).date()
    year_ago, month_later = (today - timedelta(days=365)).isoformat(), (today - timedelta(days=335)).isoformat()
    _swapped(page, _pick_date(page, "filter-from", year_ago), f"from={year_ago}")  # a date makes the range custom
    assert "range=custom" in page.url and _figure(page, "total-requests") == 1  # a year ago until today
    _swapped(page, _pick_date(page, "filter-to", month_later), f"to={month_later}")
    assert _figure(page, "total-requests") == 0 and page.locator("[data-testid=by-team]").count() == 0

    _back(page, f"from={year_ago}&to={today.isoformat()}")
    assert _figure(page, "total-requests") == 1 and page.locator("[data-testid=filter-to]").input_value() == today.isoformat()
    _back(page, "range=today")
    assert _figure(page, "total-requests") == 1 and page.locator("[data-testid=filter-range]").input_value() == "today"
    assert page.locator("[data-testid=filter-team]").input_value() == "usage-ui-blue"
    _back(page, "range=30d&team=usage-ui-blue")  # the default range, as the first swap wrote it
    assert _figure(page, "total-requests") == 1

    shared = s.context.new_page()  # the address is the view: opened afresh, it shows the same figures
    shared.goto(console_daemon.url + "/usage?team=usage-ui-red&key=" + keys["usage-ui-red"]["prefix"])
    shared.wait_for_load_state("networkidle")
    assert _figure(shared, "total-requests") == 2
    shared.close()
    # screenshots last: Playwright hides the caret by styling inputs, which the next htmx swap would copy (CSP)
    s.goto("/usage?team=usage-ui-red")
    s.shoot("usage-filtered", docs=True)
