"""WAL checkpoints on a thread of their own, off the request path.

SQLite's default moves the write-ahead log into the database file from inside
the ``COMMIT`` that takes the log past 1,000 pages: one commit in every few
hundred copies ~4 MB and syncs the file. On the request path that commit is a
request's admission or settlement, which then takes milliseconds instead of a
tenth of one (measured: the 1% slowest requests at one in flight, 3.5-4 ms).
The meter turns automatic checkpoints off on its own connection and runs a
:class:`WalCheckpointer` instead: every ``interval_s`` it checkpoints in
``PASSIVE`` mode on its own connection, which never blocks a writer (commits go
on appending to the log meanwhile), and the log restarts from its beginning
once everything in it has been copied.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from appliance.db.engine import configure_connection

log = logging.getLogger("appliance.db.checkpoint")

INTERVAL_S = 0.1
#: SQLite's own automatic checkpoint threshold, put back on a connection when the checkpointer stops.
DEFAULT_AUTOCHECKPOINT_PAGES = 1000


@dataclass(slots=True)
class CheckpointStats:
    checkpoints: int = 0  # passive checkpoints that found frames in the log
    largest_log_frames: int = 0  # the most frames the log held at a checkpoint: how far it grows between two
    failures: int = 0


class WalCheckpointer:
    """A thread that checkpoints the database's WAL every ``interval_s``."""

    def __init__(self, db_path: Path | str, interval_s: float = INTERVAL_S):
        self._path = str(db_path)
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = CheckpointStats()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread after one last checkpoint (blocking)."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=30)
        self._thread = None

    def checkpoint(self, conn: sqlite3.Connection) -> int:
        """One passive checkpoint on ``conn``; returns the frames the log held."""
        _, logged, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if logged > 0:
            self.stats.checkpoints += 1
            self.stats.largest_log_frames = max(self.stats.largest_log_frames, logged)
        return max(logged, 0)

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=10.0)
        try:
            configure_connection(conn)
            while True:
                stopping = self._stop.wait(self._interval)
                try:
                    self.checkpoint(conn)
                except sqlite3.Error as exc:  # a passive checkpoint only fails on I/O; the next one retries
                    self.stats.failures += 1
                    log.warning("WAL checkpoint failed: %s", exc)
                if stopping:
                    return
        finally:
            conn.close()
