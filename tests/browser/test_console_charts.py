"""Charts people read, in headless Chromium against the real daemon: the usage charts' time ticks and gridline
values in their units, a hover title per bucket, the range picker re-drawing the charts through htmx, and the
overview's sparklines with hover values."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.browser.conftest import Session

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COMPACT = re.compile(r"^\d+(\.\d+)?[kMB]?$")
DURATION = re.compile(r"^\d+(\.\d+)? (ms|s)$")


def _ask(base: str, secret: str, content: str) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 5, "temperature": 0},
        )
        assert response.status_code == 200, response.text


def _ticks(page, chart: str, axis: str) -> list[str]:
    return page.locator(f"[data-testid={chart}] text.tick-{axis}").all_text_contents()


def _hover_title(page, chart: str, column: int) -> str:
    """Move the mouse over bucket ``column`` of ``chart``; the title of the SVG element under the pointer."""
    hit = page.locator(f"[data-testid={chart}] rect.hit").nth(column)
    hit.scroll_into_view_if_needed()
    box = hit.bounding_box()
    assert box and box["width"] > 0, box
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    return page.evaluate(
        "([x, y]) => { const el = document.elementFromPoint(x, y); const t = el && el.querySelector(':scope > title');"
        " return t ? t.textContent : (el ? el.outerHTML.slice(0, 80) : ''); }",
        [x, y],
    )


def _swap_range(s: Session, value: str) -> None:
    with s.page.expect_response(lambda r: "/usage" in r.url and r.request.headers.get("hx-request") == "true"):
        s.page.select_option("[data-testid=filter-range]", value)
    s.page.wait_for_function("v => location.search.includes('range=' + v)", arg=value)
    s.page.wait_for_load_state("networkidle")


def test_usage_charts_have_time_ticks_unit_gridlines_hover_values_and_a_range_picker(signed_in, console_daemon):
    secret = console_daemon.create_key("charts-read")
    for word in ("chart", "axis"):
        _ask(console_daemon.url, secret, f"Say the word {word}.")
    asked = datetime.now(UTC)
    s = signed_in("victor")
    s.goto("/usage?range=24h")
    page = s.page
    now = datetime.now(UTC)
    hours_since = (now.replace(minute=0, second=0, microsecond=0) - asked.replace(minute=0, second=0, microsecond=0)).seconds
    column = 23 - hours_since // 3600  # the requests' hour: the last column, unless an hour began since
    # the last 24 whole hours: ticks every 6 hours on multiples of 6, midnight named by its day
    xs = _ticks(page, "chart-requests", "x")
    assert len(xs) == 4 and all(re.fullmatch(r"(0[06]|1[28]):00|[A-Z][a-z]{2} \d{1,2}", x) for x in xs), xs
    assert f"{now:%b} {now.day}" in xs  # today's midnight always lies within the last 24 hours
    # gridlines from 0 in round steps, in the chart's unit
    requests = _ticks(page, "chart-requests", "y")
    assert requests[0] == "0" and all(COMPACT.match(t) for t in requests) and len(requests) >= 2, requests
    tokens = _ticks(page, "chart-tokens", "y")
    assert tokens[0] == "0" and all(COMPACT.match(t) for t in tokens), tokens
    cost = _ticks(page, "chart-cost", "y")
    assert all(t.endswith(" USD") for t in cost), cost
    ttft = _ticks(page, "chart-ttft", "y")
    assert all(DURATION.match(t) for t in ttft), ttft
    # hovering the hour of the requests says when and how many, exactly
    title = _hover_title(page, "chart-requests", column)
    assert title.startswith(f"{asked:%Y-%m-%d %H}:00 UTC — Requests: "), title
    assert int(title.split("Requests: ")[1].split(" ")[0]) >= 2 and "Failed: 0" in title, title
    assert re.search(r"Prompt \(in\): [\d,]+ tokens", _hover_title(page, "chart-tokens", column))
    s.shoot("usage-charts-24h")
    # the range picker re-draws the charts through htmx: a week by the day, one tick a day
    _swap_range(s, "7d")
    days = [(now - timedelta(days=6 - i)) for i in range(7)]
    assert _ticks(page, "chart-requests", "x") == [f"{d:%b} {d.day}" for d in days]
    assert page.locator("[data-testid=chart-requests] rect.hit").count() == 7
    assert _hover_title(page, "chart-requests", 6).startswith(f"{now:%Y-%m-%d} UTC — Requests: ")
    _swap_range(s, "30d")
    mondays = _ticks(page, "chart-requests", "x")
    assert 4 <= len(mondays) <= 5 and page.locator("[data-testid=chart-requests] rect.hit").count() == 30, mondays


def test_overview_sparklines_say_their_values_on_hover(signed_in):
    s = signed_in("alice")
    s.goto("/")
    s.page.wait_for_function("document.querySelectorAll('[data-testid=cpu-card] svg.spark rect.hit').length >= 2", timeout=20_000)
    spark = s.page.locator("[data-testid=cpu-card] svg.spark").first
    spark.scroll_into_view_if_needed()
    assert re.fullmatch(r"CPU utilization, last 5 min, now \d+%", spark.get_attribute("aria-label") or "")
    box = spark.bounding_box()
    s.page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    title = s.page.evaluate(
        "([x, y]) => { const el = document.elementFromPoint(x, y); const t = el && el.querySelector(':scope > title');"
        " return t ? t.textContent : ''; }",
        [box["x"] + box["width"] - 2, box["y"] + box["height"] / 2],
    )
    assert re.fullmatch(r"CPU utilization: \d+%", title), title
    axis = s.page.locator("[data-testid=cpu-card] .spark-axis").first.all_text_contents()[0]
    assert axis.startswith("5 min ago") and axis.endswith("now"), axis
