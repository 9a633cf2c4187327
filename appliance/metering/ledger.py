"""Group commit: one writer thread turns many pending writes into one transaction.

Callers on the event loop :meth:`GroupCommitWriter.submit` a record and await the
returned future. The writer thread takes *every* record pending at that moment,
applies them all inside one ``BEGIN IMMEDIATE`` … ``COMMIT``, and only then
resolves their futures, so a caller that has been answered knows its record is
committed (durable across a process crash: WAL). Under load batches simply grow;
nothing is ever dropped. If a batch fails, its records are retried one per
transaction so that one bad record cannot take the others with it, and a locked
database is waited for, not given up on.

A caller whose request is the only one in flight, finding the thread idle,
writes its record at once in a transaction of its own instead: a batch would
hold that one record anyway, and the two thread hand-offs cost more than the
write. It never waits there: a database locked by another connection sends
the record to the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

log = logging.getLogger("appliance.metering.ledger")

LOCKED_RETRY_SECONDS = 60.0

Record = TypeVar("Record")
Result = TypeVar("Result")
#: What a transaction's work returns.
T = TypeVar("T")
#: A record's result, or the error that kept it from being written.
Outcome = tuple[Result | None, BaseException | None]


@dataclass(slots=True)
class WriterStats:
    transactions: int = 0
    records: int = 0
    largest_batch: int = 0
    failed: int = 0


def _resolve(future: asyncio.Future[Result], result: Result | None, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled; the record is written all the same
        return
    if error is not None:
        future.set_exception(error)
    else:  # written: ``result`` is what ``apply`` returned
        future.set_result(cast(Result, result))


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def transaction(conn: sqlite3.Connection, lock: threading.Lock | threading.RLock, work: Callable[[], T]) -> T:
    """Run ``work`` in one ``BEGIN IMMEDIATE`` transaction on ``conn`` under ``lock``."""
    with lock:
        return _committed(conn, work)


def _committed(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    """``work`` in one ``BEGIN IMMEDIATE`` transaction on ``conn`` (whose lock the caller holds), rolled back if it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class GroupCommitWriter(Generic[Record, Result]):
    """A single writer thread over one connection shared (under ``lock``) with the caller.

    ``apply`` writes one record inside the batch's transaction and returns what its submitter gets."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.Lock | threading.RLock,
        apply: Callable[[sqlite3.Connection, Record], Result],
        name: str = "ledger-writer",
    ):
        self._conn = conn
        self._lock = lock
        self._apply = apply
        self._name = name
        self._pending: list[tuple[Record, asyncio.AbstractEventLoop, asyncio.Future[Result]]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._writing = False
        self._busy_timeout_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        self._thread: threading.Thread | None = None
        self.stats = WriterStats()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def submit(self, record: Record, *, alone: bool = False) -> asyncio.Future[Result]:
        """Queue ``record``; the future resolves to ``apply``'s result once committed.

        With ``alone`` (the caller's request is the only one in flight) and the thread idle, the record is
        written at once in a transaction of its own on the caller's thread: at low load a batch would hold
        this one record anyway, and the two thread hand-offs cost more than the write. The write never waits
        for another connection: if the database is busy, the record goes to the thread as usual."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if self._stopping or self._thread is None:
                raise RuntimeError("the ledger writer is not running")
            idle = alone and not self._pending and not self._writing and self._lock.acquire(blocking=False)
            if not idle:
                self._pending.append((record, loop, future))
                self._cond.notify()
                return future
        try:
            outcome = self._write_alone(record)
        finally:
            self._lock.release()
        if outcome is None:  # the database is busy with another connection: the thread waits for it
            with self._cond:
                self._pending.append((record, loop, future))
                self._cond.notify()
        else:
            _resolve(future, *outcome)
        return future

    def _write_alone(self, record: Record) -> Outcome[Result] | None:
        """``record`` in a transaction of its own, never waiting for a lock; None when another connection holds it."""
        conn = self._conn
        conn.execute("PRAGMA busy_timeout=0")
        try:
            result = _committed(conn, lambda: self._apply(conn, record))
        except Exception as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
                return None  # rolled back: the thread writes it, waiting for the lock
            self.stats.failed += 1
            return None, exc
        finally:
            conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
        self._count(1)
        return result, None

    def stop(self) -> None:
        """Write everything pending, then end the thread (blocking: call it from a worker thread)."""
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread.join()
        self._thread = None

    def write_now(self, records: list[Record]) -> list[Outcome[Result]]:
        """Apply records synchronously, grouped as the thread would (used when it is not running)."""
        return self._write(records)

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                batch, self._pending = self._pending, []
                if not batch and self._stopping:
                    return
                self._writing = True
            try:
                outcomes = self._write([record for record, _, _ in batch])
            except BaseException as exc:  # pragma: no cover - _write reports per record
                log.exception("ledger writer failed")
                outcomes = [(None, exc)] * len(batch)
            finally:
                with self._cond:
                    self._writing = False
            for (_, loop, future), (result, error) in zip(batch, outcomes, strict=True):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                    loop.call_soon_threadsafe(_resolve, future, result, error)

    def _write(self, records: list[Record]) -> list[Outcome[Result]]:
        try:
            results = self._retrying(lambda: [self._apply(self._conn, r) for r in records])
            self._count(len(records))
            return [(r, None) for r in results]
        except Exception as exc:
            if len(records) == 1:
                self.stats.failed += 1
                log.error("ledger write failed: %s", exc)
                return [(None, exc)]
            log.warning("ledger batch of %d failed (%s); writing its records one by one", len(records), exc)
        return [outcome for record in records for outcome in self._write([record])]

    def _retrying(self, work: Callable[[], T]) -> T:
        deadline = time.monotonic() + LOCKED_RETRY_SECONDS
        while True:
            try:
                return transaction(self._conn, self._lock, work)
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _count(self, n: int) -> None:
        self.stats.transactions += 1
        self.stats.records += n
        self.stats.largest_batch = max(self.stats.largest_batch, n)
