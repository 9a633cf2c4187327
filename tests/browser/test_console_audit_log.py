"""The audit log in headless Chromium and on the admin API of the real daemon: a date range, an actor and an
action filter, pages in a stable order (rows written meanwhile neither repeat nor shift a page), and a CSV export
of every matching row (admins only), the same rows through GET /admin/audit."""

from __future__ import annotations

import csv
import io
import sqlite3
from datetime import UTC, datetime

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ACTOR = "user:audit-seed"
OTHER = "key:ak_auditother"
DAY1, DAY2 = datetime(2026, 1, 10, 12, tzinfo=UTC).timestamp(), datetime(2026, 1, 20, 12, tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def seeded(console_daemon) -> dict[str, int]:
    """130 rows by ACTOR (90 on DAY1, 40 on DAY2, one target a spreadsheet formula) and 5 by OTHER on DAY1."""
    rows = [(DAY1 + i, ACTOR, "seed.ping", f"thing-{i}", f"n={i}") for i in range(90)]
    rows += [(DAY2 + i, ACTOR, "seed.pong", '=HYPERLINK("x")' if i == 0 else f"other-{i}", None) for i in range(40)]
    rows += [(DAY1 + 500 + i, OTHER, "seed.other", "x", None) for i in range(5)]
    with sqlite3.connect(console_daemon.data_dir / "appliance.db") as conn:
        conn.executemany("INSERT INTO audit_log (created_at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)", rows)
    return {"actor": 130, "day1": 90, "day2": 40, "group": 135}


def _shown_ids(page) -> list[int]:
    return [int(x) for x in page.locator("[data-testid=audit-table] tbody tr").evaluate_all("rs => rs.map(r => r.dataset.audit)")]


def test_filter_page_and_export_the_audit_log(signed_in, console_daemon, seeded):
    s = signed_in("alice")
    s.goto("/audit")
    s.page.select_option("[data-testid=audit-actor]", ACTOR)
    s.page.click("[data-testid=audit-apply]")
    s.page.wait_for_load_state("networkidle")
    first = _shown_ids(s.page)
    assert len(first) == 100 and first == sorted(first, reverse=True)
    assert {t.strip() for t in s.page.locator("[data-testid=audit-table] tbody td:nth-child(2)").all_inner_texts()} == {ACTOR}

    # a row written between two pages does not shift the next one
    with sqlite3.connect(console_daemon.data_dir / "appliance.db") as conn:
        conn.execute("INSERT INTO audit_log (created_at, actor, action) VALUES (?, ?, 'seed.late')", (DAY2 + 1000, ACTOR))
    s.page.click("[data-testid=audit-older]")
    s.page.wait_for_load_state("networkidle")
    second = _shown_ids(s.page)
    assert len(second) == 30 and max(second) < min(first) and s.page.locator("[data-testid=audit-older]").count() == 0
    assert s.page.locator("[data-testid=audit-actor]").input_value() == ACTOR  # the filters stay on the next page

    s.goto("/audit")
    s.page.fill("[data-testid=audit-from]", "2026-01-10")
    s.page.fill("[data-testid=audit-to]", "2026-01-10")
    s.page.select_option("[data-testid=audit-action]", "seed.ping")
    s.page.click("[data-testid=audit-apply]")
    s.page.wait_for_load_state("networkidle")
    assert len(_shown_ids(s.page)) == 90 and s.page.locator("[data-testid=audit-older]").count() == 0

    s.goto("/audit?actor=" + ACTOR + "&to=2026-01-01")
    assert s.page.locator("[data-testid=audit-table]").count() == 0 and "match these filters" in s.page.inner_text("main")
    s.goto("/audit?from=2026-02-01&to=2026-01-01")
    assert "from must be before to" in s.page.locator("[data-testid=audit-error]").inner_text()

    # the export holds every matching row (all pages), guarded against spreadsheet formulas
    s.goto("/audit?from=2026-01-01&to=2026-01-31&actor=" + ACTOR)
    with s.page.expect_download() as download:
        s.page.click("[data-testid=audit-export]")
    with open(download.value.path(), encoding="utf-8") as f:
        exported = list(csv.DictReader(io.StringIO(f.read())))
    assert len(exported) == seeded["actor"] + 1 and {r["actor"] for r in exported} == {ACTOR}  # with the late row
    assert '\'=HYPERLINK("x")' in [r["target"] for r in exported]
    assert [r["time"] for r in exported[:2]] == ["2026-01-20T12:16:40Z", "2026-01-20T12:00:39Z"]  # newest first

    with console_daemon.admin() as admin:
        window = {"action": "seed", "from": "2026-01-10", "to": "2026-01-19", "limit": 60}
        page1 = admin.get("/admin/audit", params=window).json()
        assert len(page1["data"]) == 60 and page1["has_more"]
        page2 = admin.get("/admin/audit", params={**window, "after": page1["last_id"]}).json()
        assert len(page2["data"]) == 35 and not page2["has_more"]  # 90 + 5 on DAY1, the group "seed" matches both actions
        ids = [r["id"] for r in page1["data"] + page2["data"]]
        assert ids == sorted(set(ids), reverse=True)
        listed = admin.get("/admin/audit", params={"actor": OTHER, "format": "csv"})
        assert listed.headers["content-type"].startswith("text/csv") and "attachment" in listed.headers["content-disposition"]
        assert len(listed.text.strip().splitlines()) == 1 + 5
        refused = admin.get("/admin/audit", params={"from": "yesterday"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "from"


def test_viewers_read_the_log_but_cannot_export_it(signed_in, console_daemon, seeded):
    v = signed_in("victor")
    v.goto("/audit?actor=" + ACTOR)
    assert len(_shown_ids(v.page)) == 100
    assert v.page.locator("[data-testid=audit-export]").count() == 0
    assert v.page.request.get(console_daemon.url + "/audit.csv").status == 403


def test_key_rows_name_the_key_by_name_and_prefix(signed_in, console_daemon):
    console_daemon.create_key("audit-label-app")
    with console_daemon.admin() as admin:
        keys = admin.get("/admin/keys/").json()
    listed = keys["data"] if isinstance(keys, dict) else keys
    prefix = next(k["prefix"] for k in listed if k["name"] == "audit-label-app")
    s = signed_in("alice")
    s.goto("/audit?action=key.create&q=" + prefix)
    targets = [t.strip() for t in s.page.locator("[data-testid=audit-table] tbody td:nth-child(4)").all_inner_texts()]
    assert targets == [f"audit-label-app ({prefix}…)"], targets
