"""Files of the Files API, kept in ``<data dir>/files`` (mode 0600) with a row each in ``files``.

A file belongs to the key that uploaded it (or, for outputs, that created the batch): for any other key it does
not exist (404, never 403, so ids cannot be probed). Admins see every file. Uploads are checked line by line
(:mod:`appliance.batch.lines`) and counted against the key's storage quota before a byte is written.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

from sqlalchemy import ColumnElement, func
from sqlalchemy.engine import Engine
from sqlmodel import select

from appliance.accounts.keys import Principal
from appliance.batch.lines import CheckedFile, check_file
from appliance.db.batch_tables import Batch, BatchFile
from appliance.db.engine import session
from appliance.errors import BadRequest, Conflict, NotFound, PayloadTooLarge
from appliance.settings import Settings

PURPOSES = ("batch",)
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def visible_to(principal: Principal, column: object) -> ColumnElement[bool] | None:
    """The rows ``principal`` may see: its key's own, or every row for an admin (``None``: no filter)."""
    if principal.is_admin:
        return None
    return column == principal.id if principal.id is not None else column.is_(None)  # type: ignore[attr-defined,return-value]


def write_private(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` (mode 0600) durably: a temporary file, fsynced, renamed over."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_suffix(".partial")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class FileStore:
    def __init__(self, settings: Settings, db: Engine):
        self._settings = settings
        self._db = db
        self.root = settings.data_dir / "files"
        self._quota_lock = threading.Lock()  # one upload at a time between the quota check and its row

    def path(self, file_id: str) -> Path:
        if not file_id.startswith("file-") or not file_id[5:].isalnum():  # ids are ours: never a path from a client
            raise NotFound(f"No file with id `{file_id}`.", param="file_id", code="file_not_found")
        return self.root / f"{file_id}.jsonl"

    # ------------------------------------------------------------- uploads
    def upload(self, principal: Principal, filename: str, purpose: str, content: bytes) -> tuple[BatchFile, CheckedFile]:
        """Check and keep an uploaded batch input; :class:`BadRequest` naming bad lines, 413 past a limit."""
        if purpose not in PURPOSES:
            raise BadRequest(f"`purpose` must be one of: {', '.join(PURPOSES)}.", param="purpose")
        if len(content) > self._settings.files_max_bytes:
            raise PayloadTooLarge(f"The file is larger than files_max_bytes ({self._settings.files_max_bytes} bytes).")
        checked = check_file(content, self._settings.batch_max_lines)
        row = BatchFile(
            id=new_id("file-"),
            key_id=principal.id,
            purpose=purpose,
            filename=(filename or "upload.jsonl")[:255],
            bytes=len(content),
            lines=len(checked.lines),
            endpoints=",".join(sorted(checked.endpoints)),
            created_at=time.time(),
        )
        with self._quota_lock:
            used = self.bytes_used(principal.id)
            if used + len(content) > self._settings.files_quota_bytes_per_key:
                raise PayloadTooLarge(
                    f"This key keeps {used} bytes of files; this one would pass files_quota_bytes_per_key "
                    f"({self._settings.files_quota_bytes_per_key}). Delete files it no longer needs."
                )
            write_private(self.path(row.id), content)
            with session(self._db) as s:
                s.add(row)
                s.commit()
                s.refresh(row)
        return row, checked

    def keep_output(self, file_id: str, key_id: int | None, filename: str, content: bytes, lines: int) -> BatchFile:
        """Write (or write again, after a restart) a batch's output or error file."""
        write_private(self.path(file_id), content)
        with session(self._db) as s:
            row = s.get(BatchFile, file_id) or BatchFile(id=file_id, key_id=key_id, purpose="batch_output", filename=filename)
            row.bytes, row.lines, row.created_at = len(content), lines, time.time()
            s.add(row)
            s.commit()
            s.refresh(row)
        return row

    def bytes_used(self, key_id: int | None) -> int:
        with session(self._db) as s:
            column = BatchFile.key_id
            where = column.is_(None) if key_id is None else column == key_id  # type: ignore[union-attr]
            return int(s.exec(select(func.coalesce(func.sum(BatchFile.bytes), 0)).where(where)).one())

    # --------------------------------------------------------------- reads
    def get(self, principal: Principal, file_id: str) -> BatchFile:
        with session(self._db) as s:
            query = select(BatchFile).where(BatchFile.id == file_id)
            owned = visible_to(principal, BatchFile.key_id)
            row = s.exec(query.where(owned) if owned is not None else query).first()
        if row is None:
            raise NotFound(f"No file with id `{file_id}`.", param="file_id", code="file_not_found")
        return row

    def content(self, principal: Principal, file_id: str) -> bytes:
        return self.path(self.get(principal, file_id).id).read_bytes()

    def list(self, principal: Principal, purpose: str | None, after: str | None, limit: int) -> tuple[list[BatchFile], bool]:
        """The caller's files, newest first, after the file ``after``; and whether more follow."""
        with session(self._db) as s:
            query = select(BatchFile).order_by(BatchFile.created_at.desc(), BatchFile.id.desc())  # type: ignore[attr-defined]
            owned = visible_to(principal, BatchFile.key_id)
            if owned is not None:
                query = query.where(owned)
            if purpose:
                query = query.where(BatchFile.purpose == purpose)
            if after:
                cursor = s.get(BatchFile, after)
                if cursor is not None:
                    query = query.where(
                        (BatchFile.created_at < cursor.created_at)
                        | ((BatchFile.created_at == cursor.created_at) & (BatchFile.id < cursor.id))
                    )
            rows = list(s.exec(query.limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def delete(self, principal: Principal, file_id: str) -> None:
        row = self.get(principal, file_id)
        with session(self._db) as s:
            running = s.exec(select(Batch.id).where(Batch.input_file_id == row.id, Batch.status.in_(UNFINISHED))).first()  # type: ignore[attr-defined]
            if running is not None:
                raise Conflict(f"The batch `{running}` still reads this file; cancel it first.", param="file_id")
            s.delete(s.get(BatchFile, row.id))
            s.commit()
        self.path(row.id).unlink(missing_ok=True)
