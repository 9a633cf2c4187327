"""The meter: admit (reserve quota), then settle or release (usage row + quota settle).

Request path, as the gateway drives it::

    admission = await meter.admit(principal, request_id=..., endpoint=..., model=..., estimated_tokens=...)
    ...forward...
    cost = await meter.settle(admission, model=..., prompt_tokens=..., ...)   # or meter.release(...)

``admit`` is cheap (:mod:`appliance.metering.admission`: limits cached per key
and team; when there are quotas, conditional UPDATEs in a savepoint of the
group-commit writer's next batch, so nothing can overspend and the event loop
does no SQLite work). ``settle``/``release`` write the usage row, add the real
amounts to ``spent`` and return the held amounts from ``reserved`` in ONE
transaction (:mod:`appliance.metering.settlement`), through the same writer
(:mod:`appliance.metering.ledger`); each returns once its batch is committed.
``admit_now`` is the synchronous admission, in a transaction of its own (for
callers without an event loop).

The meter counts quota refusals in ``metrics`` (it alone knows the dimension);
the request counters and histograms are the gateway's to feed, through
``meter.metrics.observe_request``, once per request whatever its outcome.

All of it uses one dedicated SQLite connection guarded by a lock shared by the
writer thread and the synchronous callers: they never wait on SQLite's busy
handler for each other.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from appliance.accounts.keys import Principal
from appliance.db.checkpoint import DEFAULT_AUTOCHECKPOINT_PAGES, WalCheckpointer
from appliance.db.engine import configure_connection
from appliance.metering.admission import (
    Admission,
    Admissions,
    Granted,
    Refusal,
    Reservation,
    busy,
    prune_counters,
    release_reservations,
)
from appliance.metering.alerts import default_shares
from appliance.metering.ledger import GroupCommitWriter, WriterStats, transaction
from appliance.metering.pricing import PriceBook, cost_of
from appliance.metering.settlement import Settlement, UsageRow, apply_settlement, charges
from appliance.metrics import Metrics
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.meter")

CACHE_HIT_TIERS = frozenset({"exact", "semantic"})


def connect(db: Engine) -> sqlite3.Connection:
    """The meter's own connection to the database file behind ``db``, with the same pragmas."""
    path = db.url.database
    if not path or path == ":memory:":
        raise ValueError("the meter needs a database file")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    configure_connection(conn)
    return conn


class Meter:
    """Quota admission, usage ledger and cost, for the gateway."""

    def __init__(
        self,
        settings: Settings,
        db: Engine,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.db = db
        self.metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._conn = connect(db)
        self._lock = threading.RLock()
        self.prices = PriceBook(self._load_prices)
        self._admissions = Admissions(settings, self._conn, self._lock, self.prices, self.metrics, clock)
        self._abandoning: set[asyncio.Task] = set()
        self._in_flight = 0  # requests between the start of their admission and their settle or release
        self._in_flight_lock = threading.Lock()  # admit_now counts from other threads
        self._writer: GroupCommitWriter[Settlement | Reservation, float | Granted | Refusal | None] = GroupCommitWriter(
            self._conn, self._lock, _apply
        )
        self.checkpointer = WalCheckpointer(db.url.database or "")
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------
    @property
    def stale_after_s(self) -> float:
        """Age after which a reservation can only be a leftover (no request lives this long)."""
        return self.settings.request_timeout_seconds + self.settings.queue_timeout_seconds + 60.0

    @property
    def writer_stats(self) -> WriterStats:
        return self._writer.stats

    async def start(self, *, release_reservations: bool = True) -> None:
        """Start the group-commit writer and the WAL checkpointer; release every reservation a crashed daemon left.

        While they run, the meter's commits never checkpoint the WAL themselves
        (:mod:`appliance.db.checkpoint`).

        Only one daemon runs per data dir (lock file), so at start every reservation is
        a leftover. Pass ``release_reservations=False`` when several meters share a
        database on purpose (tests)."""
        if release_reservations:
            released = self._release(math.inf)
            if released:
                log.info("released %d reservations left by an earlier run", released)
        self._autocheckpoint(0)
        self.checkpointer.start()
        self._writer.start()

    async def stop(self) -> None:
        """Write everything pending and stop the writer. Later settles write synchronously."""
        await asyncio.to_thread(self._stop_threads)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_threads()
        self._conn.close()

    def _stop_threads(self) -> None:
        self._writer.stop()
        self.checkpointer.stop()
        self._autocheckpoint(DEFAULT_AUTOCHECKPOINT_PAGES)

    def _autocheckpoint(self, pages: int) -> None:
        with self._lock:
            self._conn.execute(f"PRAGMA wal_autocheckpoint={pages}")

    # -- quotas and prices -------------------------------------------------------------
    def invalidate_quotas(self) -> None:
        """Forget cached limits (call after any quota change)."""
        self._admissions.invalidate()

    def _load_prices(self) -> list[tuple[str, float, float, float]]:
        with self._lock:
            return self._conn.execute("SELECT model, input_per_m, output_per_m, cached_per_m FROM prices").fetchall()

    # -- admission -----------------------------------------------------------------
    async def admit(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        estimated_tokens: int,
        cached: bool = False,
        cap: bool = False,
        max_tokens: int | None = None,
    ) -> Admission:
        """Reserve on every quota of the key and its team, or raise 429 (QuotaExceeded/RateLimited).

        With ``cap``, ``estimated_tokens`` is an upper bound of the prompt and ``max_tokens``
        the completion asked for (``None``: as much as the engine will give). In the same
        transaction as the reservation, the completion is capped to the allowance left on
        every token and cost counter of the key and its team; the reservation is prompt +
        cap and ``admission.max_tokens`` is the cap to send to the engine. A prompt that
        alone does not fit is refused (429) before any engine work.

        The reservation rides in the group-commit writer's next batch; when this request is
        the only one in flight it is written at once instead (see :meth:`GroupCommitWriter.submit`).
        If the caller is cancelled while it waits (the client left), a reservation made
        meanwhile is released as a 499, so nothing stays held."""
        self._count_in_flight(1)
        try:
            admission = await self._admit(
                principal,
                request_id=request_id,
                endpoint=endpoint,
                model=model,
                estimated_tokens=estimated_tokens,
                cached=cached,
                cap=cap,
                max_tokens=max_tokens,
            )
        except BaseException:
            self._count_in_flight(-1)
            raise
        admission.in_flight = True
        return admission

    async def _admit(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        estimated_tokens: int,
        cached: bool,
        cap: bool,
        max_tokens: int | None,
    ) -> Admission:
        admission, reservation = self._admissions.prepare(
            principal,
            request_id=request_id,
            endpoint=endpoint,
            model=model,
            estimated_tokens=estimated_tokens,
            cached=cached,
            cap=cap,
            max_tokens=max_tokens,
        )
        if reservation is None:
            return admission
        if not self._writer.running:
            return self._admissions.conclude(admission, reservation, self._reserve_now(reservation))
        try:
            pending = self._writer.submit(reservation, alone=self._in_flight == 1)
        except RuntimeError:  # stopping right now
            return self._admissions.conclude(admission, reservation, self._reserve_now(reservation))
        try:
            outcome = _admission_outcome(await asyncio.shield(pending))
        except asyncio.CancelledError:
            pending.add_done_callback(lambda done: self._abandoned(admission, done))
            raise
        except sqlite3.OperationalError as exc:
            raise busy(exc) from None
        return self._admissions.conclude(admission, reservation, outcome)

    def admit_now(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        estimated_tokens: int,
        cached: bool = False,
        cap: bool = False,
        max_tokens: int | None = None,
    ) -> Admission:
        """:meth:`admit` in a transaction of its own, for callers without an event loop (any thread)."""
        admission, reservation = self._admissions.prepare(
            principal,
            request_id=request_id,
            endpoint=endpoint,
            model=model,
            estimated_tokens=estimated_tokens,
            cached=cached,
            cap=cap,
            max_tokens=max_tokens,
        )
        if reservation is not None:
            admission = self._admissions.conclude(admission, reservation, self._reserve_now(reservation))
        self._count_in_flight(1)
        admission.in_flight = True
        return admission

    def _reserve_now(self, reservation: Reservation) -> Granted | Refusal | None:
        """The reservation in a transaction of its own; 503 when the database stays locked past its busy timeout."""
        try:
            return transaction(self._conn, self._lock, lambda: reservation.apply(self._conn))
        except sqlite3.OperationalError as exc:
            raise busy(exc) from None

    def _abandoned(self, admission: Admission, done: asyncio.Future) -> None:
        """The admitting request was cancelled: release what its reservation holds, if it was made."""
        if done.cancelled() or done.exception() is not None or not isinstance(done.result(), Granted):
            return
        admission.holds = done.result().holds
        task = asyncio.get_running_loop().create_task(self.release(admission, status=499, model=admission.model))
        self._abandoning.add(task)
        task.add_done_callback(self._abandoning.discard)

    # -- settling --------------------------------------------------------------------
    async def settle(
        self,
        admission: Admission,
        *,
        model: str,
        variant: str | None,
        backend: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        ttft_ms: float | None,
        latency_ms: float,
        status: int,
        cache_tier: str = "miss",
        energy_joules: float | None = None,
        batch_id: str | None = None,
        price_factor: float = 1.0,
    ) -> float:
        """Record the usage row and settle the quota in one committed transaction; return the cost.

        A batch line passes its ``batch_id`` (kept in the row) and the batch discount as ``price_factor``."""
        self._leave(admission)
        if admission.finished:
            return admission.cost or 0.0
        admission.finished = True
        hit = cache_tier in CACHE_HIT_TIERS
        rate = self.prices.rate(model, variant)
        cost = price_factor * cost_of(
            rate, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens, cache_hit=hit
        )
        row = UsageRow(
            admission.request_id,
            admission.admitted_at,
            admission.key_id,
            admission.team_id,
            admission.endpoint,
            model,
            variant,
            backend,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            ttft_ms,
            latency_ms,
            status,
            cache_tier,
            cost,
            energy_joules,
            batch_id,
        )
        admission.cost = cost
        return await self._commit(admission, row, prompt_tokens + completion_tokens, hit, cost)

    async def release(
        self,
        admission: Admission,
        *,
        status: int,
        model: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        batch_id: str | None = None,
        price_factor: float = 1.0,
    ) -> None:
        """A failed or abandoned request: record what it produced, charge that, free the rest."""
        self._leave(admission)
        if admission.finished:
            return
        admission.finished = True
        latency_ms = (time.perf_counter() - admission.started) * 1000.0
        cost = price_factor * cost_of(
            self.prices.rate(model),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=0,
            cache_hit=False,
        )
        row = UsageRow(
            admission.request_id,
            admission.admitted_at,
            admission.key_id,
            admission.team_id,
            admission.endpoint,
            model,
            None,
            None,
            prompt_tokens,
            completion_tokens,
            0,
            None,
            latency_ms,
            status,
            "miss",
            cost,
            None,
            batch_id,
        )
        admission.cost = cost
        await self._commit(admission, row, prompt_tokens + completion_tokens, False, cost)

    @property
    def in_flight(self) -> int:
        """Requests admitted (or being admitted) and not yet settled or released."""
        return self._in_flight

    def _count_in_flight(self, change: int) -> None:
        with self._in_flight_lock:
            self._in_flight += change

    def _leave(self, admission: Admission) -> None:
        if admission.in_flight:
            admission.in_flight = False
            self._count_in_flight(-1)

    async def _commit(self, admission: Admission, row: UsageRow, tokens: int, hit: bool, cost: float) -> float:
        counts_tokens = not hit or self.settings.cache_counts_against_quota
        settlement = Settlement(
            row,
            charges(admission.holds, tokens, cost, counts_tokens),
            bool(admission.holds),
            cost,
            tuple(default_shares(self.settings)),
        )
        if self._writer.running:
            try:
                return _settled_cost(await self._writer.submit(settlement, alone=self._in_flight == 0))
            except RuntimeError:  # stopping right now: write it ourselves
                pass
        ((result, error),) = self._writer.write_now([settlement])
        if error is not None:
            raise error
        return _settled_cost(result)

    # -- housekeeping -------------------------------------------------------------------
    def release_stale(self, older_than_s: float | None = None) -> int:
        """Release reservations older than ``older_than_s`` (default: :attr:`stale_after_s`).

        Schedule it every minute. Returns how many were released."""
        age = self.stale_after_s if older_than_s is None else older_than_s
        return self._release(self._clock() - age)

    def _release(self, cutoff: float) -> int:
        return transaction(self._conn, self._lock, lambda: release_reservations(self._conn, cutoff))

    def prune_counters(self) -> int:
        """Delete counters of windows long over (the ledger keeps the history). Schedule hourly."""
        now = self._clock()
        return transaction(self._conn, self._lock, lambda: prune_counters(self._conn, now))


def _admission_outcome(result: float | Granted | Refusal | None) -> Granted | Refusal | None:
    """What the writer answered for a reservation (it answers a settlement with its cost)."""
    if isinstance(result, (int, float)):
        raise TypeError("the ledger writer answered a reservation with a cost")
    return result


def _settled_cost(result: float | Granted | Refusal | None) -> float:
    """What the writer answered for a settlement: its cost."""
    if not isinstance(result, (int, float)):
        raise TypeError(f"the ledger writer answered a settlement with {type(result).__name__}")
    return float(result)


def _apply(conn: sqlite3.Connection, record: Settlement | Reservation) -> float | Granted | Refusal | None:
    """The writer's work for one record: a settlement, or an admission's reservation."""
    if isinstance(record, Reservation):
        return record.apply(conn)
    return apply_settlement(conn, record)
