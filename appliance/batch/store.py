"""Batches and the recorded result of each of their lines, in SQLite.

A line's result is written in two steps around its ledger row: first *pending* (with the request id the gateway
gave it), then the usage row is committed, then the result is marked *done*. After a crash,
:meth:`BatchStore.recover` keeps a pending result whose request is in the ledger (it was charged: it counts as done)
and drops one whose request is not (it was never charged: the line runs again). So a line is never lost, and
never both charged twice and recorded once.
"""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import text
from sqlalchemy.engine import CursorResult, Engine
from sqlmodel import col, select

from appliance.accounts.keys import Principal
from appliance.batch.files import new_id, visible_to
from appliance.batch.lines import ENDPOINTS
from appliance.db.batch_tables import Batch, BatchFile, BatchResult
from appliance.db.engine import session
from appliance.errors import BadRequest, Conflict, NotFound

WINDOWS = {"24h": 24 * 3600.0}
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class LineResult:
    line: int
    custom_id: str
    request_id: str | None
    status_code: int
    ok: bool
    body: dict


def not_found(batch_id: str) -> NotFound:
    return NotFound(f"No batch with id `{batch_id}`.", param="batch_id", code="batch_not_found")


def check_metadata(metadata: object) -> dict[str, str] | None:
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items())
    ):
        raise BadRequest("`metadata` must map at most 16 keys (64 characters) to strings (512 characters).", param="metadata")
    return metadata


class BatchStore:
    def __init__(self, db: Engine):
        self._db = db

    # ------------------------------------------------------------ batches
    def create(
        self, principal: Principal, input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None
    ) -> Batch:
        if endpoint not in ENDPOINTS:
            raise BadRequest(f"`endpoint` must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
        if window not in WINDOWS:
            raise BadRequest(f"`completion_window` must be one of {', '.join(WINDOWS)}.", param="completion_window")
        with session(self._db) as s:
            query = select(BatchFile).where(col(BatchFile.id) == input_file_id, col(BatchFile.purpose) == "batch")
            owned = visible_to(principal, BatchFile.key_id)
            source = s.exec(query.where(owned) if owned is not None else query).first()
            if source is None:
                raise NotFound(f"No batch input file with id `{input_file_id}`.", param="input_file_id", code="file_not_found")
            others = sorted(set(source.endpoints.split(",")) - {endpoint})
            if others:
                raise BadRequest(
                    f"Every line of the input file must have `url` {endpoint}; it also has {', '.join(others)}.",
                    param="input_file_id",
                )
            created = time.time()
            row = Batch(
                id=new_id("batch_"),
                key_id=principal.id,
                input_file_id=source.id,
                endpoint=endpoint,
                completion_window=window,
                total=source.lines,
                metadata_json=json.dumps(metadata) if metadata is not None else None,
                created_at=created,
                expires_at=created + WINDOWS[window],
            )
            s.add(row)
            s.commit()
            s.refresh(row)
        return row

    def get(self, principal: Principal, batch_id: str) -> Batch:
        with session(self._db) as s:
            query = select(Batch).where(col(Batch.id) == batch_id)
            owned = visible_to(principal, Batch.key_id)
            row = s.exec(query.where(owned) if owned is not None else query).first()
        if row is None:
            raise not_found(batch_id)
        return row

    def load(self, batch_id: str) -> Batch | None:
        with session(self._db) as s:
            return s.get(Batch, batch_id)

    def list(self, principal: Principal, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        """The caller's batches, newest first, after the batch ``after``; and whether more follow."""
        with session(self._db) as s:
            query = select(Batch).order_by(Batch.created_at.desc(), Batch.id.desc())  # type: ignore[attr-defined]
            owned = visible_to(principal, Batch.key_id)
            if owned is not None:
                query = query.where(owned)
            if after:
                cursor = s.get(Batch, after)
                if cursor is not None:
                    same_time = (Batch.created_at == cursor.created_at) & (Batch.id < cursor.id)
                    query = query.where((col(Batch.created_at) < cursor.created_at) | same_time)
            rows = list(s.exec(query.limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def unfinished(self) -> builtins.list[Batch]:
        with session(self._db) as s:
            query = select(Batch).where(col(Batch.status).in_(UNFINISHED)).order_by(col(Batch.created_at))
            return list(s.exec(query))

    def cancel(self, principal: Principal, batch_id: str) -> Batch:
        row = self.get(principal, batch_id)
        if row.status in ("cancelling", "cancelled"):
            return row
        if row.status not in ("validating", "in_progress"):
            raise Conflict(f"The batch is {row.status}; only a validating or running batch can be cancelled.")
        return self.set_status(batch_id, "cancelling", cancelling_at=time.time())

    def set_status(self, batch_id: str, status: str, **fields: object) -> Batch:
        with session(self._db) as s:
            row = s.get(Batch, batch_id)
            if row is None:
                raise not_found(batch_id)
            if row.status == "cancelling" and status == "in_progress":
                return row  # a cancel arrived meanwhile: it wins
            row.status = status
            for name, value in fields.items():
                setattr(row, name, value)
            s.add(row)
            s.commit()
            s.refresh(row)
        return row

    # ------------------------------------------------------------- results
    def counts(self, batch_ids: builtins.list[str]) -> dict[str, tuple[int, int]]:
        """(completed, failed) lines of each batch, from its done results."""
        if not batch_ids:
            return {}
        marks = ", ".join(f":b{i}" for i in range(len(batch_ids)))
        with session(self._db) as s:
            rows = s.execute(
                text(
                    f"SELECT batch_id, sum(ok), sum(1 - ok) FROM batch_results WHERE done = 1 AND batch_id IN ({marks})"
                    " GROUP BY batch_id"
                ),
                {f"b{i}": b for i, b in enumerate(batch_ids)},
            ).all()
        return {b: (int(ok or 0), int(bad or 0)) for b, ok, bad in rows}

    def done_lines(self, batch_id: str) -> set[int]:
        with session(self._db) as s:
            return set(s.exec(select(BatchResult.line).where(col(BatchResult.batch_id) == batch_id, BatchResult.done)))

    def record(self, batch_id: str, result: LineResult, *, done: bool) -> None:
        """Keep a line's result: ``done`` at once (no ledger row follows it), or pending until :meth:`mark_done`."""
        with session(self._db) as s:
            s.execute(
                text(
                    "INSERT OR REPLACE INTO batch_results (batch_id, line, custom_id, request_id, status_code, ok, body, done,"
                    " created_at) VALUES (:b, :l, :c, :r, :s, :ok, :body, :done, :t)"
                ),
                {
                    "b": batch_id,
                    "l": result.line,
                    "c": result.custom_id,
                    "r": result.request_id,
                    "s": result.status_code,
                    "ok": result.ok,
                    "body": json.dumps(result.body, ensure_ascii=False),
                    "done": done,
                    "t": time.time(),
                },
            )
            s.commit()

    def mark_done(self, batch_id: str, line: int) -> None:
        with session(self._db) as s:
            s.execute(text("UPDATE batch_results SET done = 1 WHERE batch_id = :b AND line = :l"), {"b": batch_id, "l": line})
            s.commit()

    def recover(self) -> tuple[int, int]:
        """After a crash: pending results whose request reached the ledger are done; the rest are dropped (their lines
        run again). Returns (kept, dropped)."""
        with session(self._db) as s:
            kept = cast(
                CursorResult[Any],
                s.execute(
                    text(
                        "UPDATE batch_results SET done = 1 WHERE done = 0 AND request_id IS NOT NULL"
                        " AND EXISTS (SELECT 1 FROM usage WHERE usage.request_id = batch_results.request_id)"
                    )
                ),  # a DML statement's result is a CursorResult
            ).rowcount
            dropped = cast(CursorResult[Any], s.execute(text("DELETE FROM batch_results WHERE done = 0"))).rowcount
            s.commit()
        return int(kept or 0), int(dropped or 0)

    def results(self, batch_id: str) -> builtins.list[LineResult]:
        with session(self._db) as s:
            rows = s.exec(
                select(BatchResult).where(col(BatchResult.batch_id) == batch_id, BatchResult.done).order_by(BatchResult.line)  # type: ignore[arg-type]
            )
            return [LineResult(r.line, r.custom_id, r.request_id, r.status_code, r.ok, json.loads(r.body)) for r in rows]
