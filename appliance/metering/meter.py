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
(:mod:`appliance.metering.meter_db`); each returns once its batch is committed.
``admit_now`` is the synchronous admission, in a transaction of its own (for
callers without an event loop).

The meter counts quota refusals in ``metrics`` (it alone knows the dimension);
the request counters and histograms are the gateway's to feed, through
``meter.metrics.observe_request``, once per request whatever its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from appliance.accounts.keys import Principal
from appliance.metering.admission import Admission, Admissions
from appliance.metering.alerts import default_shares
from appliance.metering.ledger import WriterStats
from appliance.metering.meter_db import MeterDatabase
from appliance.metering.pricing import PriceBook, cost_of
from appliance.metering.reservation import Granted, prune_counters, release_reservations
from appliance.metering.settlement import Settlement, UsageRow, charges
from appliance.metrics import Metrics
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.meter")

CACHE_HIT_TIERS = frozenset({"exact", "semantic"})


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
        self.database = MeterDatabase(db)
        self.prices = PriceBook(self._load_prices)
        self._admissions = Admissions(settings, self.database.conn, self.database.lock, self.prices, self.metrics, clock)
        self._abandoning: set[asyncio.Task] = set()
        self._in_flight = 0  # requests between the start of their admission and their settle or release
        self._in_flight_lock = threading.Lock()  # admit_now counts from other threads

    # -- lifecycle -----------------------------------------------------------------
    @property
    def stale_after_s(self) -> float:
        """Age after which a reservation can only be a leftover (no request lives this long)."""
        return self.settings.request_timeout_seconds + self.settings.queue_timeout_seconds + 60.0

    @property
    def writer_stats(self) -> WriterStats:
        return self.database.writer.stats

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
        self.database.start()

    async def stop(self) -> None:
        """Write everything pending and stop the writer. Later settles write synchronously."""
        await asyncio.to_thread(self.database.stop)

    def close(self) -> None:
        self.database.close()

    # -- quotas and prices -------------------------------------------------------------
    def invalidate_quotas(self) -> None:
        """Forget cached limits (call after any quota change)."""
        self._admissions.invalidate()

    def _load_prices(self) -> list[tuple[str, float, float, float]]:
        with self.database.lock:
            return self.database.conn.execute("SELECT model, input_per_m, output_per_m, cached_per_m FROM prices").fetchall()

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
                outcome = await self.database.reserve(
                    reservation, alone=self._in_flight == 1, abandoned=lambda granted: self._abandoned(admission, granted)
                )
                admission = self._admissions.conclude(admission, reservation, outcome)
        except BaseException:
            self._count_in_flight(-1)
            raise
        admission.in_flight = True
        return admission

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
            admission = self._admissions.conclude(admission, reservation, self.database.reserve_now(reservation))
        self._count_in_flight(1)
        admission.in_flight = True
        return admission

    def _abandoned(self, admission: Admission, granted: Granted) -> None:
        """The admitting request was cancelled after its reservation was made: release what it holds."""
        admission.holds = granted.holds
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
        counts_tokens = not hit or self.settings.cache_counts_against_quota
        tokens = prompt_tokens + completion_tokens
        charged = charges(admission.holds, tokens, cost, counts_tokens)
        shares = tuple(default_shares(self.settings))
        settlement = Settlement(row, charged, bool(admission.holds), cost, shares)
        return await self.database.settle(settlement, alone=self._in_flight == 0)

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
        """A failed or abandoned request: record what it produced, charge that, free the rest.

        Its row has no variant, backend, cached tokens, first-token time, cache hit or energy."""
        await self.settle(
            admission,
            model=model,
            variant=None,
            backend=None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=0,
            ttft_ms=None,
            latency_ms=(time.perf_counter() - admission.started) * 1000.0,
            status=status,
            batch_id=batch_id,
            price_factor=price_factor,
        )

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

    # -- housekeeping -------------------------------------------------------------------
    def release_stale(self, older_than_s: float | None = None) -> int:
        """Release reservations older than ``older_than_s`` (default: :attr:`stale_after_s`).

        Schedule it every minute. Returns how many were released."""
        age = self.stale_after_s if older_than_s is None else older_than_s
        return self._release(self._clock() - age)

    def _release(self, cutoff: float) -> int:
        return self.database.transaction(lambda: release_reservations(self.database.conn, cutoff))

    def prune_counters(self) -> int:
        """Delete counters of windows long over (the ledger keeps the history). Schedule hourly."""
        now = self._clock()
        return self.database.transaction(lambda: prune_counters(self.database.conn, now))
