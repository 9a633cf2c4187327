"""Settings of the service itself: where its state lives, where it listens, how it logs, its allocator."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator


def _default_data_dir() -> Path:
    return Path.cwd() / "appliance-data"


class ServiceFields(BaseModel):
    """The data dir, the listening address and port, accepted Host headers, logging and the C allocator."""

    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Folder holding all state: the SQLite database, the model store, sockets, logs and the lock file.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP API and console listen on.")
    port: int = Field(default=8080, ge=1, le=65535, description="TCP port of the HTTP API and console.")
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "[::1]"],
        description=(
            "Host header values accepted (DNS-rebinding defence). Add the box's DNS name and address. `*` disables the check."
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Least severe log level written.")
    log_format: Literal["json", "text"] = Field(
        default="json", description="`json` writes one JSON object per line; `text` is for people."
    )
    allocator: Literal["jemalloc", "system"] = Field(
        default="jemalloc",
        description=(
            "C allocator of the daemon: `jemalloc` (re-executes once at start with libjemalloc2 preloaded, when installed, and "
            "`MALLOC_CONF=background_thread:true` before any `MALLOC_CONF` of yours) keeps its memory flat under a long mixed "
            "load; `system` keeps glibc's malloc, whose heaps grow. Engines keep the system's."
        ),
    )

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()
