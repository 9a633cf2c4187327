"""The model store's disk: free space checked before writing, a full disk recognised, data flushed, sizes for
people."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from appliance.errors import InsufficientStorage


def check_free_space(folder: Path, needed: int | None) -> None:
    """Refuse before writing when ``needed`` bytes would not fit (leaving room for the database)."""
    if needed is None:
        return
    usage = shutil.disk_usage(folder)
    reserve = min(64 << 20, usage.total // 100)
    if needed > usage.free - reserve:
        raise InsufficientStorage(
            f"not enough space in the model store: the download needs {human_size(needed)}, "
            f"{human_size(max(0, usage.free - reserve))} is free"
        )


def human_size(n: int) -> str:
    """``512 B``, ``1.5 KiB`` … ``2.0 TiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def fsync(path: Path, *, directory: bool = False) -> None:
    """Flush a file (never through a symlink) or, with ``directory``, a folder's entries to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else os.O_NOFOLLOW))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
