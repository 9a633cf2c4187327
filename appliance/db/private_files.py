"""File modes of the appliance's state: readable by the daemon's user alone.

The data dir holds key and password hashes, stored responses and cached
answers (the database, its WAL and shared-memory files) and the logs. Run by
hand ("local mode") the daemon inherits the shell's umask, typically 022,
which would leave all of that world-readable; so the daemon sets the modes
itself, at every start, for new and existing files alike:

- the data dir and the log dir 0700;
- the database, ``-wal``, ``-shm`` and ``-journal`` files and the log files 0600
  (SQLite gives the WAL and shared-memory files the database file's mode).

Under systemd the service manager owns the data dir's mode
(``StateDirectoryMode=0750``, so that the ``appliance`` group reaches the admin
socket): a data dir listed in ``$STATE_DIRECTORY`` keeps its group bits and
only loses what others could do.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path

DB_SUFFIXES = ("", "-wal", "-shm", "-journal")


def _managed_by_systemd(path: Path) -> bool:
    listed = os.environ.get("STATE_DIRECTORY", "")
    return any(entry and Path(entry).resolve() == path.resolve() for entry in listed.split(":"))


def private_dir(path: Path) -> None:
    """Set folder ``path`` to 0700 (0750 at most when systemd manages it as the state directory)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        return
    current = stat.S_IMODE(info.st_mode)
    wanted = current & 0o750 if _managed_by_systemd(path) else 0o700
    if current != wanted:
        os.chmod(path, wanted)


def private_file(path: Path) -> None:
    """Set an existing regular file to 0600; a missing file, or a symlink, is left alone."""
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != 0o600:
            os.chmod(path, 0o600)


def private_database(db_path: Path) -> None:
    """Create the database file 0600 when absent (SQLite takes an empty file as a new database, and gives its
    WAL and shared-memory files the same mode), and set the database and its companions to 0600."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    for suffix in DB_SUFFIXES:
        private_file(Path(f"{db_path}{suffix}"))


def open_private(path: str, mode: str = "a", encoding: str | None = None, errors: str | None = None) -> io.TextIOWrapper:
    """``open(path, mode)`` for appending or writing text, the file created 0600 and set to 0600 if it existed."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        stream = open(fd, mode, encoding=encoding, errors=errors)  # noqa: SIM115 - the caller owns the file
    except BaseException:
        os.close(fd)
        raise
    if not isinstance(stream, io.TextIOWrapper):  # a binary mode: not what this is for
        stream.close()
        raise ValueError(f"open_private opens text files; mode {mode!r} is binary")
    return stream
