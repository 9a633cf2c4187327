"""The usage page in headless Chromium: filters applied through htmx change the figures, the
charts and the tables, live in the address bar, and the back button restores the view before."""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _ask(base: str, secret: str, content: str) -> dict:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as client:
        response = client.post("/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": content}],
                                                             "max_tokens": 5, "temperature": 0})
        assert response.status_code == 200, response.text
        return response.json()["usage"]


def _figure(page, testid: str) -> int:
    return int(page.locator(f"#usage-report [data-testid={testid}]").first.inner_text().split()[0])


def _chart_numbers(page, chart: str) -> list[str]:
    return page.locator(f"[data-testid={chart}-table] td").all_inner_texts()


def _swapped(page, action) -> None:
    with page.expect_response(lambda r: "/usage" in r.url and r.request.headers.get("hx-request") == "true"):
        action()
    page.wait_for_load_state("networkidle")


def test_filters_change_figures_charts_and_address_and_back_restores(signed_in, console_daemon):
    with console_daemon.admin() as admin:
        teams = {n: admin.post("/admin/teams", json={"name": n}).json()["id"] for n in ("usage-ui-red", "usage-ui-blue")}
        keys = {n: admin.post("/admin/keys/", json={"name": n, "team_id": t}).json() for n, t in teams.items()}
    red = [_ask(console_daemon.url, keys["usage-ui-red"]["secret"], f"Say the word {w}.") for w in ("red", "rose")]
    blue = [_ask(console_daemon.url, keys["usage-ui-blue"]["secret"], "Say the word blue.")]

    s = signed_in("victor")  # a viewer may read usage
    s.goto("/usage")
    page = s.page
    everything = _figure(page, "total-requests")
    assert everything >= 3
    assert page.locator("[data-testid=chart-tokens] svg title").inner_text().startswith("Tokens in and out per")
    unfiltered_chart = _chart_numbers(page, "chart-tokens")

    _swapped(page, lambda: page.select_option("[data-testid=filter-team]", "usage-ui-red"))
    assert "team=usage-ui-red" in page.url
    assert _figure(page, "total-requests") == 2
    assert _figure(page, "total-prompt") == sum(u["prompt_tokens"] for u in red)
    assert _figure(page, "total-completion") == sum(u["completion_tokens"] for u in red)
    red_chart = _chart_numbers(page, "chart-tokens")
    assert red_chart != unfiltered_chart
    assert sum(int(v.replace(",", "")) for v in red_chart if v != "–") == sum(u["prompt_tokens"] + u["completion_tokens"] for u in red)
    assert page.locator("[data-testid=by-team] tbody tr").all_inner_texts()[0].startswith("usage-ui-red")
    s.shoot("usage-filtered", docs=True)

    _swapped(page, lambda: page.select_option("[data-testid=filter-team]", "usage-ui-blue"))
    assert "team=usage-ui-blue" in page.url and _figure(page, "total-requests") == 1
    assert _figure(page, "total-tokens") == blue[0]["total_tokens"]

    _swapped(page, lambda: page.select_option("[data-testid=filter-range]", "today"))
    assert "range=today" in page.url and _figure(page, "total-requests") == 1
    assert len(page.locator("[data-testid=chart-requests-table] tbody tr").all()) == 24  # one day: by the hour

    def custom_past() -> None:
        page.fill("[data-testid=filter-from]", "2020-01-01")
        page.locator("[data-testid=filter-from]").dispatch_event("change")

    _swapped(page, custom_past)
    assert "range=custom" in page.url and "from=2020-01-01" in page.url
    assert _figure(page, "total-requests") == 0
    assert page.locator("[data-testid=by-team]").count() == 0

    page.go_back()
    page.wait_for_load_state("networkidle")
    page.wait_for_function("() => location.search.includes('range=today')")
    page.wait_for_selector("#usage-report [data-testid=total-requests]")
    assert _figure(page, "total-requests") == 1
    assert page.locator("[data-testid=filter-team]").input_value() == "usage-ui-blue"

    page.go_back()
    page.wait_for_function("() => !location.search.includes('range=') && location.search.includes('team=usage-ui-blue')")
    page.wait_for_selector("#usage-report [data-testid=total-requests]")
    assert _figure(page, "total-requests") == 1

    shared = s.context.new_page()  # the address is the view: opened afresh, it shows the same figures
    shared.goto(console_daemon.url + "/usage?team=usage-ui-red&key=" + keys["usage-ui-red"]["prefix"])
    shared.wait_for_load_state("networkidle")
    assert _figure(shared, "total-requests") == 2
    shared.close()
    s.shoot("usage-page")
