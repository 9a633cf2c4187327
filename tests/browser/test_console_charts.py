"""Charts people read, and the console in the dark, in headless Chromium against the real daemon: the usage charts'
time ticks and gridline values in their units, a hover title per bucket, the range picker re-drawing the charts
through htmx, the overview's sparklines with hover values, and the browser's dark preference applied to every page
(charts included) with readable contrast."""

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
    samples = "() => document.querySelectorAll('[data-testid=cpu-card] svg.spark rect.hit').length >= 2"
    s.page.wait_for_function(samples, timeout=20_000)  # a function: a bare expression is polled by eval, refused by the CSP
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


COLOURS = """() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).slice(0, 3).map(Number);
  const style = (sel, prop) => { const el = document.querySelector(sel); return el ? rgb(getComputedStyle(el)[prop]) : null; };
  return {body: style("body", "backgroundColor"), ink: style("body", "color"), panel: style(".card", "backgroundColor"),
          muted: style(".muted", "color"), chart: style("svg.timechart text", "fill"), field: style("select", "backgroundColor")};
}"""


def _luminance(rgb: list[float]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _contrast(a: list[float], b: list[float]) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_dark_preference_darkens_every_page_with_readable_text(signed_in):
    s = signed_in("alice")
    s.goto("/usage?range=24h")
    light = s.page.evaluate(COLOURS)
    s.page.emulate_media(color_scheme="dark")
    dark = s.page.evaluate(COLOURS)
    assert _luminance(light["body"]) > 0.8 and _luminance(dark["body"]) < 0.05, (light, dark)
    assert _luminance(dark["ink"]) > 0.7 and dark["chart"] != light["chart"] and dark["field"] != light["field"], dark
    for colours in (light, dark):
        assert _contrast(colours["ink"], colours["panel"]) >= 7, colours
        assert _contrast(colours["muted"], colours["panel"]) >= 4.5, colours
        assert _contrast(colours["chart"], colours["panel"]) >= 4.5, colours
    s.shoot("usage-dark")
    pages = s.page.evaluate("[...document.querySelectorAll('nav.side .nav a')].map(a => a.getAttribute('href'))")
    assert len(pages) >= 8, pages
    for path in (p for p in pages if not p.startswith("/docs")):  # the manual has its own stylesheet
        s.goto(path)
        shade = s.page.evaluate(COLOURS)
        assert _luminance(shade["body"]) < 0.05 and _contrast(shade["ink"], shade["panel"] or shade["body"]) >= 7, (path, shade)
