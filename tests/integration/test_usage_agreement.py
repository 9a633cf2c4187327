"""The console's usage figures, ``/admin/usage`` and both CSV exports agree to the token, for every filter.

A real daemon with the real llama.cpp engine and the default tiny model answers known
requests through two keys in two teams, one of them a response-cache hit; each view is
then read through its own interface (HTML parsed, JSON, CSV) and compared with what the
clients were told in ``usage`` and with each other.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import httpx
import pytest

from appliance.accounts.users import create_user
from appliance.db.engine import make_engine
from tests.daemon import start_daemon

pytestmark = pytest.mark.slow

FIELDS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "cache_hits", "cache_tokens")
TESTIDS = {
    "total-requests": "requests",
    "total-prompt": "prompt_tokens",
    "total-completion": "completion_tokens",
    "total-tokens": "total_tokens",
    "cache-hits": "cache_hits",
    "cache-tokens": "cache_tokens",
}


class _Figures(HTMLParser):
    """The text of every element that has a data-testid, first occurrence wins."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open.append(dict(attrs).get("data-testid"))

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for testid in self._open:
            if testid and testid not in self.found and data.strip():
                self.found[testid] = data.strip()


def console_figures(html: str) -> dict[str, float | str]:
    parser = _Figures()
    parser.feed(html)
    figures: dict[str, float | str] = {name: int(parser.found[testid].split()[0]) for testid, name in TESTIDS.items()}
    figures["cost"] = float(parser.found["total-cost"].split()[0])
    figures["ttft_p50_ms"], figures["latency_p50_ms"] = (parser.found[t].split()[0] for t in ("ttft", "latency"))
    return figures


def chat(client: httpx.Client, content: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 6, "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def told_usage(response: httpx.Response) -> dict[str, int]:
    if response.headers["content-type"].startswith("text/event-stream"):
        chunks = [json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")]
        return next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    return response.json()["usage"]


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("usage"), APPLIANCE_CURRENCY="EUR")
    engine = make_engine(running.data_dir / "appliance.db")
    create_user(engine, "ursula", "ursula-password-1", role="viewer")
    engine.dispose()
    yield running
    running.stop()


def console_session(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60)
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    signed = client.post("/login", data={"username": "ursula", "password": "ursula-password-1", "csrf_token": token})
    assert signed.status_code in (200, 303) and "Sign out" in client.get("/").text
    return client


def test_console_admin_api_and_csv_agree_for_every_filter(appliance):
    with appliance.admin() as admin:
        teams = {name: admin.post("/admin/teams", json={"name": name}).json()["id"] for name in ("red", "blue")}
        assert (
            admin.put("/admin/prices/*", json={"input_per_m": 1000, "output_per_m": 3000, "cached_per_m": 100}).status_code == 200
        )
        secrets = {
            name: admin.post("/admin/keys/", json={"name": f"{name}-key", "team_id": teams[name]}).json() for name in teams
        }
    prefixes = {name: s["prefix"] for name, s in secrets.items()}
    told: dict[str, list[dict[str, int]]] = {"red": [], "blue": []}
    with appliance.client(secrets["red"]["secret"]) as red, appliance.client(secrets["blue"]["secret"]) as blue:
        told["red"].append(told_usage(chat(red, "Name a colour of the sky.")))
        told["red"].append(told_usage(chat(red, "Count to three:", stream=True)))
        told["blue"].append(told_usage(chat(blue, "Name a fruit.", stream=True)))
        for _ in range(50):  # the cache is written after the answer, off the request path
            hit = chat(blue, "Name a fruit.")
            if hit.headers["x-cache"] == "exact":
                break
            told["blue"].append(told_usage(hit))
            time.sleep(0.1)
        assert hit.headers["x-cache"] == "exact"
        told["blue"].append(told_usage(hit))
    hit_tokens = told["blue"][-1]["prompt_tokens"] + told["blue"][-1]["completion_tokens"]

    today = datetime.now(UTC).date()
    week = {"from": (today - timedelta(days=6)).isoformat(), "to": today.isoformat()}
    family = "gemma-3-270m"
    filters = [
        {},
        {"team": "red"},
        {"team": "blue"},
        {"key": prefixes["red"]},
        {"key": prefixes["blue"]},
        {"model": family},
        {"model": family, "team": "blue", "key": prefixes["blue"]},
        {"team": "red", "key": prefixes["blue"]},
    ]
    console = console_session(appliance.url)
    try:
        with appliance.admin() as admin:
            for chosen in filters:
                expected = [
                    u
                    for name, us in told.items()
                    for u in us
                    if chosen.get("team", name) == name and chosen.get("key", prefixes[name]) == prefixes[name]
                ]
                api = admin.get("/admin/usage", params={**week, **chosen})
                assert api.status_code == 200, (chosen, api.text)
                report = api.json()
                assert report["currency"] == "EUR"
                totals = report["totals"]
                assert totals["requests"] == len(expected), chosen
                assert totals["prompt_tokens"] == sum(u["prompt_tokens"] for u in expected), chosen
                assert totals["completion_tokens"] == sum(u["completion_tokens"] for u in expected), chosen
                with_hit = chosen.get("team", "blue") == "blue" and chosen.get("key", prefixes["blue"]) == prefixes["blue"]
                assert (totals["cache_hits"], totals["cache_tokens"]) == ((1, hit_tokens) if with_hit else (0, 0)), chosen
                if with_hit:  # at 1000/3000 per million, cached at 100: the replay saved the difference
                    hit_usage = told["blue"][-1]
                    saved = (hit_usage["prompt_tokens"] * 900 + hit_usage["completion_tokens"] * 2900) / 1e6
                    assert totals["cache_saved"] == pytest.approx(saved), chosen

                page = console.get("/usage", params={"range": "7d", **chosen})
                assert page.status_code == 200, (chosen, page.text[:500])
                shown = console_figures(page.text)
                assert {f: shown[f] for f in FIELDS} == {f: totals[f] for f in FIELDS}, chosen
                assert shown["cost"] == round(totals["cost"], 6), chosen
                for timing in ("ttft_p50_ms", "latency_p50_ms"):
                    assert shown[timing] == ("–" if totals[timing] is None else f"{totals[timing]:.0f}"), (chosen, timing)
                if expected:  # every chosen view but the empty one has streamed engine answers
                    assert totals["latency_p50_ms"] is not None and totals["ttft_p95_ms"] >= totals["ttft_p50_ms"], chosen

                exported = list(
                    csv.DictReader(io.StringIO(console.get("/usage.csv", params={"range": "7d", "by": "team", **chosen}).text))
                )
                api_csv = list(
                    csv.DictReader(
                        io.StringIO(admin.get("/admin/usage", params={**week, **chosen, "by": "team", "format": "csv"}).text)
                    )
                )
                assert exported == api_csv, chosen
                for field in FIELDS:
                    assert sum(int(row[field]) for row in exported) == totals[field], (chosen, field)
                assert sum(float(row["cost"]) for row in exported) == pytest.approx(totals["cost"]), chosen

                by_hour = admin.get("/admin/usage", params={**week, **chosen, "by": "hour"}).json()["rows"]
                assert sum(r["total_tokens"] for r in by_hour) == totals["total_tokens"], chosen
            for param, value in (("team", "green"), ("key", "ak_nobody"), ("model", "no-such-model")):
                refused = admin.get("/admin/usage", params={param: value})
                assert refused.status_code == 400 and refused.json()["error"]["param"] == param
                assert console.get("/usage", params={param: value}).status_code == 400
                assert console.get("/usage.csv", params={param: value}).status_code == 400
    finally:
        console.close()
