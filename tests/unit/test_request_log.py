"""The request log's writer and queries on a real, migrated database: bounded queue, group writes, pruning by
age and row count, filters, paging, refusals by reason, and a CSV no spreadsheet reads as a formula."""

from __future__ import annotations

import sqlite3
import time

import pytest

from appliance.db.engine import make_engine, migrate
from appliance.errors import BadRequest
from appliance.requestlog.entry import RequestEntry
from appliance.requestlog.queries import parse_filters, query_requests, refusals, to_csv
from appliance.requestlog.writer import TRIM_SLACK, RequestLog


def _entry(i: int, status: int = 200, reason: str | None = None, at: float | None = None, **fields: object) -> RequestEntry:
    return RequestEntry(
        created_at=time.time() if at is None else at,
        request_id=f"req_test{i:08d}",
        method="POST",
        endpoint="/v1/chat/completions",
        status=status,
        latency_ms=1.5,
        reason=reason,
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "appliance.db"
    migrate(path)
    return path


def _count(db_path) -> int:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT count(*) FROM request_log").fetchone()[0]


def _wait_written(log: RequestLog, n: int) -> None:
    deadline = time.monotonic() + 10
    while log.written < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.written == n


def test_entries_are_written_in_batches_and_stop_writes_what_is_queued(db_path):
    log = RequestLog(db_path, days=14, max_rows=1000)
    log.start()
    for i in range(300):
        log.record(_entry(i))
    log.stop()
    assert (log.written, log.dropped) == (300, 0)
    assert _count(db_path) == 300


def test_a_full_queue_drops_and_counts_instead_of_growing(db_path):
    log = RequestLog(db_path, days=14, max_rows=1000, buffer_rows=100)
    for i in range(10_000):  # the writer is not running: nothing leaves the queue
        log.record(_entry(i))
    assert (log.pending(), log.dropped) == (100, 9_900)
    log.start()
    log.stop()
    assert _count(db_path) == 100


def test_prune_removes_rows_past_the_age_then_the_oldest_past_the_cap(db_path):
    now = time.time()
    log = RequestLog(db_path, days=2, max_rows=50)
    log.start()
    for i in range(30):
        log.record(_entry(i, at=now - 3 * 86400))  # older than two days
    for i in range(30, 130):
        log.record(_entry(i, at=now - 60 + i / 10))
    _wait_written(log, 130)
    assert log.prune(now) == 30 + 50
    with sqlite3.connect(db_path) as conn:
        kept = [r for (r,) in conn.execute("SELECT request_id FROM request_log ORDER BY id")]
    assert kept == [f"req_test{i:08d}" for i in range(80, 130)]  # the newest 50
    log.stop()


def test_the_writer_trims_the_oldest_rows_once_past_the_cap_by_the_slack(db_path):
    log = RequestLog(db_path, days=14, max_rows=100)
    log.start()
    for i in range(TRIM_SLACK + 1_500):
        log.record(_entry(i))
    _wait_written(log, TRIM_SLACK + 1_500)
    log.stop()
    with sqlite3.connect(db_path) as conn:
        kept = [r for (r,) in conn.execute("SELECT request_id FROM request_log ORDER BY id")]
    assert 100 <= len(kept) <= 100 + TRIM_SLACK
    assert kept[-1] == f"req_test{TRIM_SLACK + 1_499:08d}"  # the newest stay


def _filled(db_path) -> tuple[object, RequestLog]:
    log = RequestLog(db_path, days=14, max_rows=1000)
    log.start()
    log.record(_entry(1, 401, "invalid_api_key", address="10.0.0.9"))
    log.record(_entry(2, 404, "model_not_found", model="no-such-model"))
    log.record(_entry(3, 429, "insufficient_quota"))
    log.record(_entry(4, 200, model="=HYPERLINK(1)"))
    log.record(_entry(5, 500, "internal_error"))
    log.record(_entry(6, 499, "client_disconnected"))
    for i in range(7, 20):
        log.record(_entry(i, 401, "invalid_api_key"))
    _wait_written(log, 19)
    return make_engine(db_path), log


def test_filters_by_outcome_class_code_reason_model_and_request_id(db_path):
    db, log = _filled(db_path)

    def ids(**params: str) -> list[int]:
        rows = query_requests(db, parse_filters(params), limit=100).rows
        return sorted(int(r["request_id"][-8:]) for r in rows)

    assert ids(request_id="req_test00000002") == [2]
    assert ids(status="served") == [4]
    assert ids(status="failed") == [5, 6]
    assert ids(status="refused") == [1, 2, 3, *range(7, 20)]
    assert ids(status="4xx") == [1, 2, 3, 6, *range(7, 20)]
    assert ids(status="429") == [3]
    assert ids(reason="model_not_found") == [2]
    assert ids(model="no-such-model") == [2]
    assert ids(since="1h", reason="insufficient_quota") == [3]
    assert ids(until="1h") == []
    with pytest.raises(BadRequest):
        parse_filters({"status": "teapot"})
    with pytest.raises(BadRequest):
        query_requests(db, parse_filters({"key": "sk-nobody"}))
    log.stop()


def test_pages_follow_the_cursor_newest_first_without_repeats(db_path):
    db, log = _filled(db_path)
    seen: list[str] = []
    cursor = None
    while True:
        page = query_requests(db, parse_filters({}), cursor=cursor, limit=7)
        seen += [r["request_id"] for r in page.rows]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"req_test{i:08d}" for i in range(19, 0, -1)]
    log.stop()


def test_refusals_are_counted_by_status_and_reason(db_path):
    db, log = _filled(db_path)
    counted = refusals(db, since=time.time() - 60, until=time.time() + 60)
    assert counted[0] == {"status": 401, "reason": "invalid_api_key", "requests": 14}
    assert {(r["status"], r["reason"]) for r in counted} == {
        (401, "invalid_api_key"),
        (404, "model_not_found"),
        (429, "insufficient_quota"),
        (500, "internal_error"),
        (499, "client_disconnected"),
    }
    log.stop()


def test_the_csv_guards_cells_a_spreadsheet_would_run(db_path):
    db, log = _filled(db_path)
    text = to_csv(query_requests(db, parse_filters({"status": "served"})).rows)
    header, row = text.splitlines()
    assert header.startswith("time,request_id,key,")
    assert ",'=HYPERLINK(1)," in row
    log.stop()
