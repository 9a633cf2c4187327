"""The ``request_log`` table: one row per request the daemon answered (``appliance.requestlog``).

No foreign key to ``api_keys``: a row outlives the key it names, and its writer never waits on another table.
"""

from __future__ import annotations

from sqlalchemy import Index
from sqlmodel import Field, SQLModel


class RequestLogRow(SQLModel, table=True):
    __tablename__ = "request_log"
    __table_args__ = (Index("ix_request_log_key_created", "key_id", "created_at"),)
    id: int | None = Field(default=None, primary_key=True)
    created_at: float = Field(index=True)
    request_id: str = Field(max_length=64, index=True)
    key_id: int | None = None
    user: str | None = Field(default=None, max_length=200)  # the console user
    address: str | None = Field(default=None, max_length=200)
    method: str = Field(max_length=8)
    endpoint: str = Field(max_length=200)  # the route's path template
    model: str | None = Field(default=None, max_length=200)
    status: int
    reason: str | None = Field(default=None, max_length=200)  # the error's code (or type)
    latency_ms: float
