"""Hourly and daily usage roll-ups (``usage_rollups``), recomputed idempotently.

Each run finds the hour buckets holding usage rows written since the previous run
(rows are found by id, above a watermark kept in ``kv``, so a row written late
into an old hour is still seen), recomputes those hours from the ledger, then
recomputes the touched days from their hours. Running it twice changes nothing.

The aggregation reads happen outside the write transaction; the write holds the
database's write lock only for the few DELETE/INSERTs of the rolled-up rows.
Reading an hour of the ledger fills the page cache of the pooled connection it
runs on (SQLite keeps up to 2 MiB per connection until it closes); each run
frees it again (``PRAGMA shrink_memory``), so the pool's connections, taken in
turn by successive runs, do not each keep 2 MiB of ledger pages.
Rows committed while a run is reading land above its watermark and are picked up
by the next run. Schedule ``rollup(db, time.time())`` every 5 minutes.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, Engine, text

HOUR = 3600
DAY = 86400
WATERMARK = "rollups.last_usage_id"
LAST_RUN = "rollups.last_run_at"
_SUMS = (
    "count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), coalesce(sum(cached_tokens), 0), "
    "coalesce(sum(cost), 0)"
)


def _get(conn: Connection, key: str) -> str | None:
    return conn.execute(text("SELECT value FROM kv WHERE key = :k"), {"k": key}).scalar()


def _put(conn: Connection, key: str, value: str) -> None:
    conn.execute(
        text("INSERT INTO kv (key, value) VALUES (:k, :v) ON CONFLICT(key) DO UPDATE SET value = excluded.value"),
        {"k": key, "v": value},
    )


def rollup(db: Engine, now: float | None = None, *, full: bool = False) -> int:
    """Recompute the buckets touched since the last run (all of them with ``full``); returns hours recomputed."""
    now = time.time() if now is None else now
    with db.connect() as conn:
        last = 0 if full else int(_get(conn, WATERMARK) or 0)
        top = conn.execute(text("SELECT max(id) FROM usage")).scalar()
        if top is None or top <= last:
            return 0
        hours = [
            int(h)
            for (h,) in conn.execute(
                text("SELECT DISTINCT CAST(created_at / 3600 AS INTEGER) * 3600 FROM usage WHERE id > :a AND id <= :b"),
                {"a": last, "b": top},
            )
        ]
        hourly = []
        for hour in hours:
            rows = conn.execute(
                text(
                    f"SELECT key_id, team_id, model, {_SUMS} FROM usage WHERE created_at >= :s AND created_at < :e"
                    " GROUP BY key_id, team_id, model"
                ),
                {"s": hour, "e": hour + HOUR},
            ).all()
            hourly += [(hour, *row) for row in rows]
        conn.exec_driver_sql("PRAGMA shrink_memory")
    days = sorted({h - h % DAY for h in hours})
    with db.begin() as conn:
        if full:
            conn.execute(text("DELETE FROM usage_rollups"))
        for hour in hours:
            conn.execute(text("DELETE FROM usage_rollups WHERE period = 'hour' AND bucket_start = :b"), {"b": hour})
        if hourly:
            conn.execute(
                text(
                    "INSERT INTO usage_rollups (period, bucket_start, key_id, team_id, model, requests, prompt_tokens,"
                    " completion_tokens, cached_tokens, cost) VALUES ('hour', :b, :k, :t, :m, :r, :p, :c, :x, :cost)"
                ),
                [dict(zip(("b", "k", "t", "m", "r", "p", "c", "x", "cost"), row, strict=True)) for row in hourly],
            )
        for day in days:
            conn.execute(text("DELETE FROM usage_rollups WHERE period = 'day' AND bucket_start = :d"), {"d": day})
            conn.execute(
                text(
                    "INSERT INTO usage_rollups (period, bucket_start, key_id, team_id, model, requests, prompt_tokens,"
                    " completion_tokens, cached_tokens, cost)"
                    " SELECT 'day', :d, key_id, team_id, model, sum(requests), sum(prompt_tokens), sum(completion_tokens),"
                    " sum(cached_tokens), sum(cost) FROM usage_rollups WHERE period = 'hour' AND bucket_start >= :d"
                    " AND bucket_start < :e GROUP BY key_id, team_id, model"
                ),
                {"d": day, "e": day + DAY},
            )
        _put(conn, WATERMARK, str(top))
        _put(conn, LAST_RUN, repr(now))
    return len(hours)
