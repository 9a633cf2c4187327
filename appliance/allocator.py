"""The daemon's C allocator: jemalloc where the system has it, glibc's malloc otherwise.

Under a steady mixed load glibc's malloc keeps memory the daemon has freed: the
usage roll-ups, the SQLite sorter and the answers in flight free their blocks,
but small long-lived blocks allocated among them, in the arenas of threads that
come and go, pin the pages, and the free space kept inside the heaps grows for
as long as the daemon runs (measured with ``tests/bench/soak.py --heap-log``; in
use memory flat, free space rising at every roll-up). jemalloc sorts blocks by
size class into separate runs and gives pages nobody uses back to the system
after a few seconds, so the same load holds its memory flat. It does so from a
background thread (``background_thread:true`` in ``MALLOC_CONF``): without one,
pages freed by a thread that then sits idle (a scheduler thread after a usage
roll-up) wait in that thread's arena for its next allocation, and the daemon's
memory rises by a few MiB each time another thread takes a turn at the work.

A library cannot be swapped in after the process started, so the daemon
re-executes itself once, at start, as ``python -m appliance.daemon`` with
jemalloc in ``LD_PRELOAD``, its options in ``MALLOC_CONF`` (an operator's own
``MALLOC_CONF`` follows them and wins) and the settings given on its command line
as ``APPLIANCE_*`` variables (same PID, so systemd's notify socket and watchdog
are unaffected). The re-executed daemon puts ``LD_PRELOAD`` and ``MALLOC_CONF``
back as they were, so the engines it starts run on the allocator they would have
had. ``allocator = "system"`` keeps glibc.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("appliance.allocator")

LIBRARY = "libjemalloc.so.2"
#: Where Debian, Ubuntu, Fedora and Arch install it (``apt-get install libjemalloc2``).
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
#: Set across the re-exec: what ``LD_PRELOAD`` was before, to be restored (empty: it was unset).
SAVED_PRELOAD = "APPLIANCE_PRELOAD_BEFORE"
#: The same for ``MALLOC_CONF``, jemalloc's options.
SAVED_CONF = "APPLIANCE_MALLOC_CONF_BEFORE"
#: jemalloc's options for the daemon: a background thread returns freed pages whichever thread freed them.
JEMALLOC_OPTIONS = "background_thread:true"


def find_jemalloc(dirs: tuple[str, ...] = SEARCH_DIRS) -> Path | None:
    """The jemalloc shared library on this system, or None."""
    return next((Path(d) / LIBRARY for d in dirs if (Path(d) / LIBRARY).is_file()), None)


def jemalloc_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether jemalloc is mapped into this process."""
    try:
        return LIBRARY in maps.read_text()
    except OSError:
        return False


def restore_preload(environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """After the re-exec: ``LD_PRELOAD`` and ``MALLOC_CONF`` as they were before it, for every process this one starts."""
    for saved, name in ((SAVED_PRELOAD, "LD_PRELOAD"), (SAVED_CONF, "MALLOC_CONF")):
        if saved not in environ:
            continue
        before = environ.pop(saved)
        if before:
            environ[name] = before
        else:
            environ.pop(name, None)


def preload_environment(library: Path, environ: dict[str, str]) -> dict[str, str]:
    """The environment to re-execute with: jemalloc first in ``LD_PRELOAD``, its options first in
    ``MALLOC_CONF`` (later options override earlier ones), the old values saved."""
    before = environ.get("LD_PRELOAD", "")
    conf = environ.get("MALLOC_CONF", "")
    return {
        **environ,
        SAVED_PRELOAD: before,
        "LD_PRELOAD": f"{library}:{before}" if before else str(library),
        SAVED_CONF: conf,
        "MALLOC_CONF": f"{JEMALLOC_OPTIONS},{conf}" if conf else JEMALLOC_OPTIONS,
    }


def use_jemalloc(choice: str, given: dict[str, str]) -> str:
    """Make this process run on jemalloc when ``choice`` is ``jemalloc`` and the library is there.

    Re-executes the process as the daemon (does not return) the first time, with ``given`` added
    to its environment; returns the allocator in use: ``jemalloc`` or ``system``.
    """
    loaded = jemalloc_loaded()
    if SAVED_PRELOAD in os.environ:  # this is the re-executed process
        restore_preload()
        if not loaded:
            log.warning("the daemon was restarted with %s preloaded but it is not mapped; glibc's malloc is in use", LIBRARY)
        return "jemalloc" if loaded else "system"
    if choice != "jemalloc" or loaded:
        return "jemalloc" if loaded else "system"
    library = find_jemalloc()
    if library is None:
        log.warning(
            "allocator = jemalloc but %s is not installed (Debian/Ubuntu: apt-get install libjemalloc2); "
            "glibc's malloc is in use, and its heaps grow under a long mixed load",
            LIBRARY,
        )
        return "system"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "appliance.daemon"], preload_environment(library, {**os.environ, **given}))
    raise AssertionError("unreachable")  # pragma: no cover
