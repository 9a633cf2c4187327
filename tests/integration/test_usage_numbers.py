"""Usage numbers read right: the CSV's costs to a millionth and counts as integers, a small cost budget
shown with enough decimals to read (not "0.0 / 0.0 · 11%").

A real daemon answers real requests on the default model at prices chosen to make float sums ragged
(33.3 and 77.7 per million tokens); a key carries a cost budget of a few hundredths. The console's
CSV and ``/admin/usage?format=csv`` are read as a spreadsheet would, and the usage page's budget row is
parsed and compared with the counter ``/admin/quotas`` reports.
"""

from __future__ import annotations

import csv
import io
import re

import pytest

from appliance.accounts.users import create_user
from appliance.db.engine import make_engine
from tests.daemon import start_daemon
from tests.integration.test_usage_agreement import chat, console_session

pytestmark = pytest.mark.slow
LIMIT = 0.0125


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("numbers"), APPLIANCE_CURRENCY="CHF")
    engine = make_engine(running.data_dir / "appliance.db")
    create_user(engine, "ursula", "ursula-password-1", role="viewer")
    engine.dispose()
    yield running
    running.stop()


def test_csv_and_budget_figures_read_right(box):
    secret = box.create_key("tiny-budget")
    with box.admin() as admin:
        admin.put("/admin/prices/*", json={"input_per_m": 33.3, "output_per_m": 77.7}).raise_for_status()
        admin.put(f"/admin/quotas/key:{secret[:12]}", json={"cost_per_month": LIMIT}).raise_for_status()
    with box.client(secret) as client:
        for content in ("Zähle bis drei", "count to five, slowly", "おはよう"):
            chat(client, content)
    with box.admin() as admin:
        spent = admin.get(f"/admin/quotas/key:{secret[:12]}").json()["usage"]["cost_per_month"]["spent"]
        api_csv = admin.get("/admin/usage", params={"by": "model", "format": "csv"}).text
    assert 0 < spent < LIMIT

    console = console_session(box.url)
    try:
        exported = console.get("/usage.csv", params={"range": "7d", "by": "model"}).text
        page = console.get("/usage").text
    finally:
        console.close()
    for text in (exported, api_csv):
        rows = list(csv.DictReader(io.StringIO(text)))
        assert rows, text
        for row in rows:
            assert re.fullmatch(r"\d+\.\d{6}", row["cost"]), row["cost"]
            assert abs(float(row["cost"]) - spent) < 1e-6, (row["cost"], spent)
            for count in ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "cache_hits"):
                assert re.fullmatch(r"\d+", row[count]), (count, row[count])
            assert "e-" not in text.lower()

    row = re.search(r'data-testid="forecast-row">(.*?)</tr>', page, re.S)
    assert row, page[-3000:]
    shown_spent = re.search(r'data-testid="forecast-spent">([\d.]+) CHF<', row.group(1))
    shown_limit = re.search(r'data-testid="forecast-limit">([\d.]+) CHF<', row.group(1))
    assert shown_spent and shown_limit, row.group(1)
    assert float(shown_limit.group(1)) == LIMIT
    assert float(shown_spent.group(1)) > 0 and abs(float(shown_spent.group(1)) - spent) <= LIMIT / 200, (shown_spent, spent)
