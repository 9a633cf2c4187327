"""The Batch API's tables: uploaded and produced files, batches, and each line's recorded outcome (``appliance.batch``)."""

from __future__ import annotations

import time

from sqlalchemy import UniqueConstraint
from sqlmodel import Field, SQLModel


class BatchFile(SQLModel, table=True):
    """A file of the Files API: an uploaded batch input, or a batch's output or error file.

    The bytes live in ``<data dir>/files/<id>.jsonl`` (mode 0600). Only the key that owns it (``key_id`` NULL: the
    local admin socket) and admins see it; for anyone else it does not exist (404)."""

    __tablename__ = "files"
    id: str = Field(primary_key=True, max_length=64)  # file-…
    key_id: int | None = Field(default=None, index=True)
    purpose: str = Field(max_length=32)  # batch | batch_output
    filename: str = Field(max_length=255)
    bytes: int = 0
    lines: int = 0
    endpoints: str = ""  # the `url`s its lines name, comma-separated (inputs only)
    created_at: float = Field(default_factory=time.time)


class Batch(SQLModel, table=True):
    """A batch of requests run from an input file at batch priority (OpenAI's Batch API)."""

    __tablename__ = "batches"
    id: str = Field(primary_key=True, max_length=64)  # batch_…
    key_id: int | None = Field(default=None, index=True)
    input_file_id: str = Field(max_length=64)
    endpoint: str = Field(max_length=64)
    completion_window: str = Field(default="24h", max_length=16)
    status: str = Field(default="validating", max_length=16, index=True)
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = Field(default=None, max_length=64)
    error_file_id: str | None = Field(default=None, max_length=64)
    errors: str | None = None  # JSON list of batch-level errors
    metadata_json: str | None = None  # the client's metadata, JSON
    created_at: float = Field(default_factory=time.time, index=True)
    expires_at: float
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None


class BatchResult(SQLModel, table=True):
    """The recorded outcome of one line of a batch. A line without a done row runs (again) after a restart; a row
    that is not done yet is kept only if the ledger holds its request (see ``appliance.batch.store``)."""

    __tablename__ = "batch_results"
    __table_args__ = (UniqueConstraint("batch_id", "line"),)
    id: int | None = Field(default=None, primary_key=True)
    batch_id: str = Field(max_length=64, index=True)
    line: int  # 0-based line index in the input file
    custom_id: str
    request_id: str | None = Field(default=None, max_length=64)
    status_code: int
    ok: bool
    body: str  # JSON: the response body, or the error envelope
    done: bool = False
    created_at: float = Field(default_factory=time.time)
