"""Background jobs (pulls, imports, verifications, quantizations) with progress and cancel.

Each job runs its work function in a thread of its own; the work reports through
a :class:`JobContext` (``progress``, ``check_cancelled``, ``attach_process``) and
never learns about HTTP. Progress becomes a bounded list of events that the
admin API streams as SSE; cancelling sets an event the work checks between
chunks, and kills a child process the work attached (the quantizer).

With a database engine, each job is also a row in ``jobs`` (progress written at
most once a second), and rows left ``running`` by a previous process are marked
failed at start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine, update
from sqlmodel import col

from appliance.db import engine as dbmod
from appliance.db.tables import Job as JobRow
from appliance.errors import ApplianceError, NotFound
from appliance.jsontypes import JsonObject
from appliance.store.errors import JobCancelled

log = logging.getLogger("appliance.store.jobs")

TERMINAL = ("done", "failed", "cancelled")
EVENT_INTERVAL_S = 0.2  # at most ~5 progress events a second reach subscribers
DB_INTERVAL_S = 1.0
MAX_EVENTS = 1000


@dataclass
class Job:
    id: int
    kind: str
    target: str | None
    state: str = "queued"  # queued | running | done | failed | cancelled
    done_bytes: int = 0
    total_bytes: int | None = None
    message: str | None = None
    result: JsonObject | None = None
    error: JsonObject | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    _events: deque[JsonObject] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS), repr=False)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def progress(self) -> float | None:
        if self.state == "done":
            return 1.0
        if self.total_bytes:
            return min(1.0, self.done_bytes / self.total_bytes)
        return None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def view(self) -> JsonObject:
        return {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "state": self.state,
            "progress": self.progress,
            "done_bytes": self.done_bytes,
            "total_bytes": self.total_bytes,
            "message": self.message,
            "result": self.result,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }

    def _emit(self, type_: str, *, state: str | None = None, **extra: str) -> JsonObject:
        """Append an event; with ``state``, the job enters that state in the same step, so a follower never sees
        the new state without its event (a finished job whose last event is still to come)."""
        with self._lock:
            if state is not None:
                self.state = state
            event = {
                "seq": next(self._seq),
                "type": type_,
                "job": self.id,
                "state": self.state,
                "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes,
                "progress": self.progress,
                "message": self.message,
                "time": time.time(),
                **extra,
            }
            self._events.append(event)
            return event

    def events_after(self, seq: int) -> list[JsonObject]:
        with self._lock:
            return [e for e in self._events if e["seq"] > seq]

    def events_and_finished(self, seq: int) -> tuple[list[JsonObject], bool]:
        """The events after ``seq`` and whether the job has ended, read together: once it has, its last event
        is among them (or was read before)."""
        with self._lock:
            return [e for e in self._events if e["seq"] > seq], self.finished

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job ends (tests, CLI helpers); True if it ended."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.finished


class JobContext:
    """What a work function sees: report progress, honour cancel, hand over a child process."""

    def __init__(self, job: Job, on_progress: Callable[[Job], None] | None = None):
        self.job = job
        self._on_progress = on_progress
        self._last_event = 0.0

    @property
    def cancel_event(self) -> threading.Event:
        return self.job.cancel_event

    def check_cancelled(self) -> None:
        if self.job.cancel_event.is_set():
            raise JobCancelled("the job was cancelled")

    def progress(self, done: int, total: int | None = None, message: str | None = None, *, force: bool = False) -> None:
        job = self.job
        job.done_bytes = done
        if total is not None:
            job.total_bytes = total
        if message is not None:
            job.message = message
        now = time.monotonic()
        if force or message is not None or now - self._last_event >= EVENT_INTERVAL_S:
            self._last_event = now
            job._emit("progress")
            if self._on_progress is not None:
                self._on_progress(job)

    def stage(self, message: str) -> None:
        """A new phase of the work (e.g. 'verifying'): always sent."""
        self.progress(self.job.done_bytes, message=message, force=True)

    def within(self, before: int, total: int) -> JobContext:
        """A context for one part of a larger whole: its progress counts from ``before`` against ``total``."""
        return PartContext(self, before, total)

    def attach_process(self, proc: subprocess.Popen | None) -> None:
        self.job._process = proc
        if proc is not None and self.job.cancel_event.is_set():
            _terminate(proc)


class PartContext(JobContext):
    """One part of a job's work (a file of several): progress is shifted into the whole's."""

    def __init__(self, whole: JobContext, before: int, total: int):
        super().__init__(whole.job)
        self._whole, self._before, self._total = whole, before, total

    def progress(self, done: int, total: int | None = None, message: str | None = None, *, force: bool = False) -> None:
        self._whole.progress(self._before + done, self._total, message, force=force)

    def stage(self, message: str) -> None:
        self._whole.stage(message)


class NullContext(JobContext):
    """For direct calls (CLI-less scripts, the daemon's start-up seed): no events, never cancelled."""

    def __init__(self) -> None:
        super().__init__(Job(id=0, kind="inline", target=None))


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass


Work = Callable[[JobContext], "JsonObject | None"]


class JobRegistry:
    """All jobs of this process. ``JobRegistry(db_engine)`` also records them in the ``jobs`` table."""

    def __init__(self, db_engine: Engine | None = None, *, max_running: int = 4, keep: int = 200):
        self._db = db_engine
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots = threading.BoundedSemaphore(max_running)
        self._keep = keep
        self._last_db_write: dict[int, float] = {}
        if self._db is not None:
            self._fail_leftovers(self._db)

    # ------------------------------------------------------------ queries
    def get(self, job_id: int) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}", param="id", code="job_not_found")
        return job

    def list(self) -> list[Job]:
        return sorted(self._jobs.values(), key=lambda j: j.id, reverse=True)

    # ------------------------------------------------------------ control
    def submit(self, kind: str, target: str | None, work: Work) -> Job:
        job = Job(id=self._new_id(kind, target), kind=kind, target=target)
        with self._lock:
            self._jobs[job.id] = job
            self._forget_old()
        job._emit("state")
        thread = threading.Thread(target=self._run, args=(job, work), name=f"job-{job.id}-{kind}", daemon=True)
        job._thread = thread
        thread.start()
        return job

    def cancel(self, job_id: int) -> Job:
        job = self.get(job_id)
        if not job.finished:
            job.cancel_event.set()
            if job._process is not None:
                _terminate(job._process)
            job._emit("log", message="cancel requested")
        return job

    def clear_finished(self, kinds: tuple[str, ...] | None = None) -> int:
        """Forget the finished jobs (of ``kinds``, or all) from the live list; their rows in the ``jobs`` table stay.
        Returns how many were forgotten."""
        with self._lock:
            gone = [j.id for j in self._jobs.values() if j.finished and (kinds is None or j.kind in kinds)]
            for job_id in gone:
                del self._jobs[job_id]
        return len(gone)

    def shutdown(self, timeout: float = 5.0) -> None:
        for job in list(self._jobs.values()):
            if not job.finished:
                self.cancel(job.id)
        deadline = time.monotonic() + timeout
        for job in list(self._jobs.values()):
            job.wait(max(0.0, deadline - time.monotonic()))

    async def follow(self, job_id: int, after: int = 0, poll: float = EVENT_INTERVAL_S) -> AsyncIterator[JsonObject]:
        """Events of a job from ``after`` on, until it ends (for SSE)."""
        job = self.get(job_id)
        while True:
            events, finished = job.events_and_finished(after)
            for event in events:
                after = event["seq"]
                yield event
            if finished:
                return
            await asyncio.sleep(poll)

    # ------------------------------------------------------------ internals
    def _run(self, job: Job, work: Work) -> None:
        with self._slots:
            if job.cancel_event.is_set():
                self._finish(job, "cancelled", message="cancelled before it started")
                return
            job._emit("state", state="running")
            self._write(job)
            ctx = JobContext(job, on_progress=self._write_throttled)
            try:
                result = work(ctx)
            except JobCancelled as exc:
                self._finish(job, "cancelled", message=exc.message)
            except ApplianceError as exc:
                if job.cancel_event.is_set():
                    self._finish(job, "cancelled", message="cancelled")
                else:
                    self._finish(
                        job,
                        "failed",
                        message=exc.message,
                        error={"message": exc.message, "type": exc.type, "code": exc.code, "status": exc.status},
                    )
            except Exception as exc:  # the job ends either way; the log has the traceback
                log.exception("job %s (%s) crashed", job.id, job.kind)
                self._finish(
                    job,
                    "failed",
                    message=f"internal error ({type(exc).__name__})",
                    error={"message": "internal error", "type": "server_error", "code": "internal_error", "status": 500},
                )
            else:
                self._finish(job, "done", result=result, message="done")
            finally:
                job._process = None

    def _finish(
        self,
        job: Job,
        state: str,
        *,
        message: str | None = None,
        result: JsonObject | None = None,
        error: JsonObject | None = None,
    ) -> None:
        job.message = message
        job.result = result
        job.error = error
        job.finished_at = time.time()
        job._emit("state", state=state)  # last, with its event: `finished` flips only when the rest is in place
        self._write(job)
        self._last_db_write.pop(job.id, None)

    def _new_id(self, kind: str, target: str | None) -> int:
        if self._db is None:
            return next(self._ids)
        with dbmod.session(self._db) as s:
            row = JobRow(kind=kind, target=target, state="queued")
            s.add(row)
            s.commit()
            assert row.id is not None
            return row.id

    def _write_throttled(self, job: Job) -> None:
        now = time.monotonic()
        if now - self._last_db_write.get(job.id, 0.0) >= DB_INTERVAL_S:
            self._last_db_write[job.id] = now
            self._write(job)

    def _write(self, job: Job) -> None:
        if self._db is None:
            return
        try:
            with dbmod.session(self._db) as s:
                s.execute(
                    update(JobRow)
                    .where(col(JobRow.id) == job.id)
                    .values(
                        state=job.state,
                        progress=job.progress or 0.0,
                        done_bytes=job.done_bytes,
                        total_bytes=job.total_bytes,
                        message=job.message,
                        finished_at=job.finished_at,
                    )
                )
                s.commit()
        except Exception:  # progress rows are best effort; the in-memory job stays right
            log.warning("could not record job %s in the database", job.id, exc_info=True)

    def _fail_leftovers(self, db: Engine) -> None:
        with dbmod.session(db) as s:
            s.execute(
                update(JobRow)
                .where(col(JobRow.state).in_(("queued", "running")))
                .values(state="failed", message="interrupted by a restart", finished_at=time.time())
            )
            s.commit()

    def _forget_old(self) -> None:
        done = [j for j in self._jobs.values() if j.finished]
        for job in sorted(done, key=lambda j: j.id)[: max(0, len(self._jobs) - self._keep)]:
            del self._jobs[job.id]
