"""Runs the lines of unfinished batches, at batch priority, in the capacity interactive requests leave.

One loop looks at the unfinished batches a few times a second (and at once when a batch is created or cancelled):
it moves new batches to ``in_progress``, starts lines while :class:`~appliance.batch.capacity.Capacity` allows,
expires batches past their window, and finalizes batches whose lines all have a result. Each line is a task that
calls the gateway (:mod:`appliance.batch.line_call`) and records its result around its ledger row
(:mod:`appliance.batch.deferred`, :mod:`appliance.batch.store`). At start, results a crash left pending are settled
or dropped, and every line without a result runs (again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from appliance.accounts.keys import LOCAL_ADMIN, KeyRing, Principal, _principal
from appliance.batch.capacity import Capacity
from appliance.batch.deferred import HeldLedger, held_ledger
from appliance.batch.files import FileStore
from appliance.batch.finalize import finalize
from appliance.batch.line_call import Outcome, TryLater, call_line
from appliance.batch.lines import RequestLine, check_file
from appliance.batch.store import BatchStore, LineResult
from appliance.db.batch_tables import Batch
from appliance.errors import ApplianceError, AuthenticationFailed, NotFound, error_envelope
from appliance.serving.gateway import Gateway
from appliance.settings import Settings

log = logging.getLogger("appliance.batch.runner")

BUSY_POLL_S = 0.05  # how often a batch with lines waiting for capacity looks again
IDLE_POLL_S = 5.0
DRAIN_S = 15.0  # how long a stopping daemon lets the lines in flight finish (then they are cancelled and run again)


@dataclass
class Work:
    """A running batch as the runner holds it."""

    batch: Batch
    lines: list[RequestLine]
    pending: deque[int]  # positions in ``lines`` without a result, in file order
    in_flight: set[int] = field(default_factory=set)
    not_before: float = 0.0  # a busy box asked to wait until then (monotonic)


class BatchRunner:
    def __init__(
        self,
        settings: Settings,
        store: BatchStore,
        files: FileStore,
        gateway: Gateway,
        capacity: Capacity,
        keyring: KeyRing,
    ):
        self._settings = settings
        self._store = store
        self._files = files
        self._gateway = gateway
        self._capacity = capacity
        self._keyring = keyring
        self._work: dict[str, Work] = {}
        self._tasks: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        kept, dropped = await asyncio.to_thread(self._store.recover)
        if kept or dropped:
            log.info("batch results left pending by an earlier run: %d in the ledger (kept), %d not (run again)", kept, dropped)
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="batch-runner")

    async def stop(self) -> None:
        """Start no more lines; let those in flight finish for up to :data:`DRAIN_S`, then cancel the rest."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=DRAIN_S)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def wake(self) -> None:
        """Look at the batches now (a batch was created or cancelled)."""
        self._wake.set()

    @property
    def lines_in_flight(self) -> int:
        return self._capacity.total

    # ----------------------------------------------------------------- loop
    async def _loop(self) -> None:
        while True:
            try:
                busy = await self._tick()
            except Exception:
                log.exception("batch runner step failed")
                busy = False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), BUSY_POLL_S if busy else IDLE_POLL_S)

    async def _tick(self) -> bool:
        """One look at every unfinished batch; True while some have lines or work left."""
        busy = False
        for row in await asyncio.to_thread(self._store.unfinished):
            work = self._work.get(row.id) or await self._open(row)
            if work is None:
                continue
            work.batch = row
            busy = await self._advance(work) or busy
        return busy

    async def _open(self, row: Batch) -> Work | None:
        try:
            content = await asyncio.to_thread(self._files.path(row.input_file_id).read_bytes)
            lines = (await asyncio.to_thread(check_file, content, self._settings.batch_max_lines)).lines
        except (OSError, ApplianceError) as exc:
            message = exc.message if isinstance(exc, ApplianceError) else "The input file can no longer be read."
            errors = json.dumps([{"code": "invalid_file", "message": message, "param": "input_file_id", "line": None}])
            await asyncio.to_thread(self._store.set_status, row.id, "failed", failed_at=time.time(), errors=errors)
            return None
        done = await asyncio.to_thread(self._store.done_lines, row.id)
        work = Work(row, lines, deque(i for i, line in enumerate(lines) if line.index not in done))
        self._work[row.id] = work
        return work

    async def _advance(self, work: Work) -> bool:
        batch = work.batch
        if batch.status == "validating":
            work.batch = await asyncio.to_thread(self._store.set_status, batch.id, "in_progress", in_progress_at=time.time())
            batch = work.batch
        if batch.status == "cancelling":
            if not work.in_flight:
                await self._finish(work, "cancelled")
            return bool(work.in_flight)
        if batch.status == "in_progress" and time.time() >= batch.expires_at:
            if not work.in_flight:
                await self._expire(work)
            return bool(work.in_flight)
        if batch.status == "in_progress" and not work.pending and not work.in_flight:
            work.batch = await asyncio.to_thread(self._store.set_status, batch.id, "finalizing", finalizing_at=time.time())
            batch = work.batch
        if batch.status == "finalizing":
            if not work.in_flight:
                await self._finish(work, "completed")
            return False
        self._start_lines(work)
        return True

    def _start_lines(self, work: Work) -> None:
        if time.monotonic() < work.not_before:
            return
        while work.pending:
            position = work.pending[0]
            model = self._capacity.model_of(str(work.lines[position].body.get("model")))
            if not self._capacity.may_start(model):
                return
            work.pending.popleft()
            work.in_flight.add(position)
            self._capacity.acquire(model)
            task = asyncio.get_running_loop().create_task(self._run(work, position, model))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _finish(self, work: Work, status: str) -> None:
        await asyncio.to_thread(finalize, self._store, self._files, work.batch, status)
        self._work.pop(work.batch.id, None)
        log.info("batch %s %s", work.batch.id, status)

    async def _expire(self, work: Work) -> None:
        for position in list(work.pending):
            line = work.lines[position]
            body = {"code": "batch_expired", "message": "This line was not run within the batch's completion window."}
            result = LineResult(line.index, line.custom_id, None, 0, False, body)
            await asyncio.to_thread(self._store.record, work.batch.id, result, done=True)
        work.pending.clear()
        await self._finish(work, "expired")

    # ----------------------------------------------------------------- lines
    def _principal(self, key_id: int | None) -> Principal:
        """The batch key's principal now: a key revoked or expired since the batch was created runs no more lines."""
        if key_id is None:
            return LOCAL_ADMIN
        try:
            row = self._keyring.get(key_id)
        except NotFound:
            raise AuthenticationFailed("The batch's API key no longer exists.") from None
        if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= time.time()):
            raise AuthenticationFailed("The batch's API key was revoked or has expired.")
        return _principal(row)

    async def _run(self, work: Work, position: int, model: str) -> None:
        line = work.lines[position]
        batch_id = work.batch.id
        held = HeldLedger(batch_id, self._settings.batch_price_factor)
        token = held_ledger.set(held)
        try:
            try:
                principal = await asyncio.to_thread(self._principal, work.batch.key_id)
                outcome = await call_line(self._gateway, principal, line)
            except TryLater as later:
                await held.write()  # whatever the engine did before the box said no is charged
                work.pending.appendleft(position)
                work.not_before = time.monotonic() + later.delay_s
                return
            except ApplianceError as exc:
                outcome = Outcome(exc.status, error_envelope(exc.message, exc.type, exc.param, exc.code))
            except Exception:
                log.exception("batch %s line %d failed", batch_id, line.index + 1)
                outcome = Outcome(500, error_envelope("The line failed inside the appliance.", "server_error"))
            result = LineResult(
                line.index, line.custom_id, outcome.request_id or held.request_id, outcome.status_code, outcome.ok, outcome.body
            )
            if held.calls:  # pending, charged, then done: a crash in between is settled by BatchStore.recover
                await asyncio.to_thread(self._store.record, batch_id, result, done=False)
                await held.write()
                await asyncio.to_thread(self._store.mark_done, batch_id, line.index)
            else:
                await asyncio.to_thread(self._store.record, batch_id, result, done=True)
        except asyncio.CancelledError:
            await held.write()  # stopping: the line runs again after the restart; what it used is charged
            raise
        finally:
            held_ledger.reset(token)
            work.in_flight.discard(position)
            self._capacity.release(model)
            self._wake.set()
