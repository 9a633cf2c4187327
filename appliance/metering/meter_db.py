"""The meter's database: its own SQLite connection, the group-commit writer and the WAL checkpointer beside it.

Two kinds of record reach the ledger: an admission's :class:`~appliance.metering.reservation.Reservation` (answered
with what it was granted or refused) and a settle's or release's :class:`~appliance.metering.settlement.Settlement`
(answered with its cost). Each rides the writer's next batch (:mod:`appliance.metering.ledger`), or a transaction
of its own while the writer is not running.

The connection is guarded by a lock shared by the writer thread and the synchronous callers: they never wait on
SQLite's busy handler for each other.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine

from appliance.db.checkpoint import DEFAULT_AUTOCHECKPOINT_PAGES, WalCheckpointer
from appliance.db.engine import configure_connection
from appliance.metering.admission import busy
from appliance.metering.ledger import GroupCommitWriter, transaction
from appliance.metering.reservation import Granted, Refusal, Reservation
from appliance.metering.settlement import Settlement, apply_settlement

#: What the writer is handed, and what it answers for it.
LedgerRecord = Settlement | Reservation
LedgerAnswer = float | Granted | Refusal | None

T = TypeVar("T")


def connect(db: Engine) -> sqlite3.Connection:
    """The meter's own connection to the database file behind ``db``, with the same pragmas."""
    path = db.url.database
    if not path or path == ":memory:":
        raise ValueError("the meter needs a database file")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    configure_connection(conn)
    return conn


class MeterDatabase:
    def __init__(self, db: Engine):
        self.conn = connect(db)
        self.lock = threading.RLock()
        self.writer: GroupCommitWriter[LedgerRecord, LedgerAnswer] = GroupCommitWriter(self.conn, self.lock, _apply)
        self.checkpointer = WalCheckpointer(db.url.database or "")
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Start the WAL checkpointer and the writer; while they run, commits never checkpoint the WAL themselves."""
        self._autocheckpoint(0)
        self.checkpointer.start()
        self.writer.start()

    def stop(self) -> None:
        """Write everything pending and stop the writer and the checkpointer. Later records are written synchronously."""
        self.writer.stop()
        self.checkpointer.stop()
        self._autocheckpoint(DEFAULT_AUTOCHECKPOINT_PAGES)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop()
        self.conn.close()

    def _autocheckpoint(self, pages: int) -> None:
        with self.lock:
            self.conn.execute(f"PRAGMA wal_autocheckpoint={pages}")

    def transaction(self, work: Callable[[], T]) -> T:
        """``work`` in one transaction of its own on the meter's connection."""
        return transaction(self.conn, self.lock, work)

    # -- records -------------------------------------------------------------------
    async def reserve(
        self, reservation: Reservation, *, alone: bool, abandoned: Callable[[Granted], None]
    ) -> Granted | Refusal | None:
        """Make ``reservation`` in the writer's next batch (``alone``: the only request in flight, written at once).

        If the caller is cancelled while it waits, ``abandoned`` is handed what the reservation was granted,
        once it is written, so that it can be released."""
        if not self.writer.running:
            return self.reserve_now(reservation)
        try:
            pending = self.writer.submit(reservation, alone=alone)
        except RuntimeError:  # stopping right now
            return self.reserve_now(reservation)
        try:
            return _admission_outcome(await asyncio.shield(pending))
        except asyncio.CancelledError:
            pending.add_done_callback(lambda done: _granted_to(done, abandoned))
            raise
        except sqlite3.OperationalError as exc:
            raise busy(exc) from None

    def reserve_now(self, reservation: Reservation) -> Granted | Refusal | None:
        """The reservation in a transaction of its own; 503 when the database stays locked past its busy timeout."""
        try:
            return self.transaction(lambda: reservation.apply(self.conn))
        except sqlite3.OperationalError as exc:
            raise busy(exc) from None

    async def settle(self, settlement: Settlement, *, alone: bool) -> float:
        """Write ``settlement`` (committed when this returns); its cost."""
        if self.writer.running:
            try:
                return _settled_cost(await self.writer.submit(settlement, alone=alone))
            except RuntimeError:  # stopping right now: write it ourselves
                pass
        ((result, error),) = self.writer.write_now([settlement])
        if error is not None:
            raise error
        return _settled_cost(result)


def _granted_to(done: asyncio.Future[LedgerAnswer], abandoned: Callable[[Granted], None]) -> None:
    """Hand an abandoned admission's reservation to ``abandoned``, if it was made."""
    if done.cancelled() or done.exception() is not None:
        return
    granted = done.result()
    if isinstance(granted, Granted):
        abandoned(granted)


def _admission_outcome(result: LedgerAnswer) -> Granted | Refusal | None:
    """What the writer answered for a reservation (it answers a settlement with its cost)."""
    if isinstance(result, (int, float)):
        raise TypeError("the ledger writer answered a reservation with a cost")
    return result


def _settled_cost(result: LedgerAnswer) -> float:
    """What the writer answered for a settlement: its cost."""
    if not isinstance(result, (int, float)):
        raise TypeError(f"the ledger writer answered a settlement with {type(result).__name__}")
    return float(result)


def _apply(conn: sqlite3.Connection, record: LedgerRecord) -> LedgerAnswer:
    """The writer's work for one record: a settlement, or an admission's reservation."""
    if isinstance(record, Reservation):
        return record.apply(conn)
    return apply_settlement(conn, record)
