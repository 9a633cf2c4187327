"""The request log's writer: recording costs the request one append to a bounded queue, nothing more.

:meth:`RequestLog.record` puts an entry on a queue of at most ``buffer_rows`` entries and returns; it never waits
and never touches the database. One thread takes everything queued (after a short linger, so a burst is one
wake-up) and writes it in one transaction. When the queue is full the entry is dropped and counted
(:attr:`RequestLog.dropped`): a flood of refused requests (10,000 anonymous 401s a minute, say) costs a bounded
amount of memory, never a growing one. Unlike the usage ledger, no client was told its log row was written, so a
crash may lose the entries still queued (at most the linger's worth in normal operation).

The table is bounded twice. The writer counts the rows it adds, and once they pass ``request_log_max_rows`` by
:data:`TRIM_SLACK` it deletes the oldest beyond the cap itself, so a flood never takes the table further than that.
:meth:`RequestLog.prune`, which the scheduler runs at start and every minute, deletes rows older than
``request_log_days``, then the oldest beyond the cap.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path

from appliance.db.engine import configure_connection
from appliance.metering.ledger import transaction
from appliance.requestlog.entry import COLUMNS, RequestEntry

log = logging.getLogger("appliance.requestlog")

BUFFER_ROWS = 10_000
BATCH_MAX = 1_000
#: How far past the row cap the table may grow before the writer trims it (one trim per this many rows at most).
TRIM_SLACK = 1_000
#: After the first entry arrives the writer waits this long for more: one transaction for a burst.
LINGER_S = 0.05
DAY = 86400.0

_OVER_CAP = "DELETE FROM request_log WHERE id <= (SELECT id FROM request_log ORDER BY id DESC LIMIT 1 OFFSET ?)"
_INSERT = f"INSERT INTO request_log ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"


class RequestLog:
    """The buffered writer of ``request_log`` rows, and its pruning."""

    def __init__(self, db_path: Path, *, days: int, max_rows: int, buffer_rows: int = BUFFER_ROWS):
        self.days = days
        self.max_rows = max_rows
        self._db_path = db_path
        self._queue: queue.Queue[RequestEntry | None] = queue.Queue(buffer_rows)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None
        self._rows = 0  # rows in the table, as the writer last counted them
        self._full = 0  # entries refused by a full queue (counted on the request path)
        self._failed = 0  # entries whose write failed (counted by the writer thread)
        self.written = 0

    # -- the request path ------------------------------------------------------------
    def record(self, entry: RequestEntry) -> None:
        """Queue ``entry`` for the writer; when the queue is full, drop it and count it."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self._full += 1

    @property
    def dropped(self) -> int:
        """Entries not kept since the start: the queue was full, or their write failed."""
        return self._full + self._failed

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._conn = self._connect()
        self._rows = self._conn.execute("SELECT count(*) FROM request_log").fetchone()[0]
        self._thread = threading.Thread(target=self._loop, name="request-log", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("request log: queue still full at stop; its entries are lost")
        self._thread.join(timeout)
        self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def pending(self) -> int:
        return self._queue.qsize()

    # -- the writer thread -----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._db_path, check_same_thread=False, isolation_level=None, timeout=10.0)
        configure_connection(conn)
        return conn

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            time.sleep(LINGER_S)
            batch = [first]
            while len(batch) < BATCH_MAX:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry is None:
                    stopping = True
                    break
                batch.append(entry)
            self._write(batch)
        self._drain()

    def _drain(self) -> None:
        rest: list[RequestEntry] = []
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is not None:
                rest.append(entry)
        if rest:
            self._write(rest)

    def _write(self, batch: list[RequestEntry]) -> None:
        conn = self._conn
        assert conn is not None, "the request log was not started"
        rows = [entry.row() for entry in batch]
        try:
            transaction(conn, self._lock, lambda: conn.executemany(_INSERT, rows))
        except sqlite3.Error:
            log.exception("request log: %d entries could not be written", len(rows))
            self._failed += len(rows)
            return
        self.written += len(rows)
        self._rows += len(rows)
        if self._rows > self.max_rows + TRIM_SLACK:
            transaction(conn, self._lock, lambda: conn.execute(_OVER_CAP, (self.max_rows,)))
            self._rows = self.max_rows

    # -- bounds ----------------------------------------------------------------------
    def prune(self, now: float | None = None) -> int:
        """Delete rows older than ``days``, then the oldest beyond ``max_rows``; the number deleted.

        Called from the scheduler's thread; it shares the writer's connection under the writer's lock."""
        cutoff = (time.time() if now is None else now) - self.days * DAY
        conn = self._conn or self._connect()
        try:
            old = transaction(conn, self._lock, lambda: conn.execute("DELETE FROM request_log WHERE created_at < ?", (cutoff,)))
            over = transaction(conn, self._lock, lambda: conn.execute(_OVER_CAP, (self.max_rows,)))
            left = transaction(conn, self._lock, lambda: conn.execute("SELECT count(*) FROM request_log").fetchone()[0])
            self._rows = int(left)
            return old.rowcount + over.rowcount
        finally:
            if conn is not self._conn:
                conn.close()
