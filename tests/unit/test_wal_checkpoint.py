"""The meter's commits never checkpoint the WAL themselves; its checkpointer thread does, off the request path."""

from __future__ import annotations

import asyncio
import os
import sqlite3

from appliance.db.checkpoint import DEFAULT_AUTOCHECKPOINT_PAGES, WalCheckpointer
from tests.meterkit import add_key, rows, set_quota

SETTLE = dict(variant=None, backend="llamacpp", cached_tokens=0, ttft_ms=5.0, latency_ms=20.0, status=200)
PAGE = 4096
FRAME = PAGE + 24  # a WAL frame: its header and one page


def _wal_frames(path: str) -> int:
    return max(os.path.getsize(path + "-wal") - 32, 0) // FRAME


async def _requests(meter, key, n: int, tag: str) -> None:
    for i in range(n):
        admission = await meter.admit(key, request_id=f"{tag}{i}", endpoint="chat", model="m", estimated_tokens=5)
        await meter.settle(admission, model="m", prompt_tokens=5, completion_tokens=7, **SETTLE)


def _autocheckpoint(meter) -> int:
    return meter.database.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]


async def test_commits_on_the_request_path_leave_the_log_to_the_checkpointer(meter, db):
    path = db.url.database
    key = add_key(db)
    set_quota(db, "key", key.id, requests_per_minute=100_000, tokens_per_day=10**9)
    assert _autocheckpoint(meter) == 0 and meter.database.checkpointer.running
    meter.database.checkpointer.stop()  # nobody checkpoints now: what the requests write stays in the log
    database_bytes = os.path.getsize(path)
    await _requests(meter, key, 400, "r")
    wal_frames = _wal_frames(path)
    # past SQLite's own threshold, and still no commit copied the log into the database file
    assert wal_frames > 2 * DEFAULT_AUTOCHECKPOINT_PAGES
    assert os.path.getsize(path) == database_bytes
    meter.database.checkpointer.start()
    for _ in range(100):
        if os.path.getsize(path) > database_bytes:
            break
        await asyncio.sleep(0.05)
    assert os.path.getsize(path) > database_bytes  # the checkpointer copied the log
    assert meter.database.checkpointer.stats.checkpoints >= 1
    assert meter.database.checkpointer.stats.largest_log_frames == wal_frames
    # the log restarts from its beginning once it is all in the database: it does not grow further
    await _requests(meter, key, 50, "s")
    await asyncio.sleep(0.3)
    assert _wal_frames(path) == wal_frames
    assert rows(db, "SELECT count(*) FROM usage") == [(450,)]


async def test_a_stopped_meter_gives_checkpoints_back_to_its_commits(meter):
    await meter.stop()
    assert not meter.database.checkpointer.running
    assert _autocheckpoint(meter) == DEFAULT_AUTOCHECKPOINT_PAGES


def test_the_checkpointer_copies_the_log_of_another_connection(tmp_path):
    path = tmp_path / "c.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (x BLOB)")
    for _ in range(50):
        writer.execute("INSERT INTO t VALUES (randomblob(8000))")
    checkpointer = WalCheckpointer(path, interval_s=0.01)
    checkpointer.start()
    try:
        for _ in range(200):
            if checkpointer.stats.checkpoints:
                break
            checkpointer._stop.wait(0.01)
    finally:
        checkpointer.stop()
    assert checkpointer.stats.checkpoints >= 1 and checkpointer.stats.failures == 0
    assert os.path.getsize(path) > 50 * 8000  # the rows are in the database file now
    writer.close()
