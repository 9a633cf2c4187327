"""SQLite's memory in the daemon is bounded, however many pooled connections have read the ledger."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack

from sqlalchemy import text

from appliance.db.engine import SQLITE_HEAP_LIMIT_BYTES, make_engine
from tests.meterkit import sqlite_memory_used

MIB = 1024 * 1024


def test_the_pool_s_page_caches_stay_under_the_heap_limit(tmp_path):
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:  # ~10 MiB of rows: more than one connection's 2 MiB page cache
        conn.execute("CREATE TABLE usage (id INTEGER PRIMARY KEY, key TEXT, model TEXT, tokens INTEGER, cost REAL)")
        conn.executemany(
            "INSERT INTO usage (key, model, tokens, cost) VALUES (?, ?, ?, ?)",
            [(f"key-{i % 50:03d}-" + "k" * 24, f"model-{i % 3}", i, i * 0.5) for i in range(200_000)],
        )
    engine = make_engine(path)
    try:
        with engine.connect() as first:
            assert first.execute(text("PRAGMA soft_heap_limit")).scalar() == SQLITE_HEAP_LIMIT_BYTES
        before = sqlite_memory_used()
        with ExitStack() as held:  # all 16 of the pool's connections at once, each reading the whole table
            for _ in range(16):
                conn = held.enter_context(engine.connect())
                rows = conn.execute(text("SELECT key, model, SUM(tokens), COUNT(*) FROM usage GROUP BY key, model")).all()
                assert len(rows) == 150
            grown = sqlite_memory_used() - before
        # Uncapped, each connection keeps 2 MiB of the table's pages: 16 of them hold 32 MiB.
        assert grown <= SQLITE_HEAP_LIMIT_BYTES + 2 * MIB, f"SQLite grew by {grown / MIB:.1f} MiB"
    finally:
        engine.dispose()
