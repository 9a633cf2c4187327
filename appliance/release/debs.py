"""The Debian packages a bundle carries: what install.sh would fetch, with the dependencies a minimal Debian lacks.

install.sh needs Python 3.11 with venv and jemalloc (a bundle's wheels are built, so no compiler or cmake).
A minimal Debian (``debootstrap --variant=minbase``) has the packages of priority ``required`` and the
essential ones, with their dependencies; a bundle carries the rest of the dependency closure of
:data:`WANTED`, as ``apt-get download`` fetches them on the machine that makes the bundle. On bookworm
that is about 30 packages: python3, python3.11 and their -minimal and -stdlib libraries, python3-venv with
the pip and setuptools wheels it bundles, libssl3, libsqlite3-0, libexpat1, the Kerberos and tirpc
libraries, media-types, ca-certificates, openssl and libjemalloc2.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from appliance.release.manifest import Log

WANTED = ("python3", "python3-venv", "libjemalloc2")
_DEPENDS_FLAGS = (
    "--recurse",
    "--no-recommends",
    "--no-suggests",
    "--no-conflicts",
    "--no-breaks",
    "--no-replaces",
    "--no-enhances",
)


def _closure(packages: Iterable[str]) -> set[str]:
    names = list(packages)
    if not names:
        return set()
    out = subprocess.run(["apt-cache", "depends", *_DEPENDS_FLAGS, *names], capture_output=True, text=True, check=True).stdout
    # Real packages are the unindented lines; `<virtual>` names and foreign architectures are not downloadable.
    return {line.strip() for line in out.splitlines() if line and not line[0].isspace() and "<" not in line and ":" not in line}


def minimal_debian() -> set[str]:
    """The packages every Debian has: installed ones of priority required or essential, and what they depend on."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Priority} ${Essential}\n"], capture_output=True, text=True, check=True
    ).stdout
    base = [f[0] for f in (line.split() for line in out.splitlines()) if len(f) >= 2 and ("required" in f[1:] or "yes" in f[1:])]
    return _closure(base) | set(base)


def needed(wanted: Iterable[str] = WANTED) -> list[str]:
    return sorted(_closure(wanted) - minimal_debian())


def download(into: Path, log: Log = print) -> list[str]:
    """``apt-get download`` the packages into ``into``; [] (and a note) on a machine without apt."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None:
        log("no apt-get here: the bundle carries no Debian packages (the target box must have python3-venv and libjemalloc2)")
        return []
    names = needed()
    into.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(["apt-get", "download", "-q", *names], cwd=into, capture_output=True, text=True)
    if fetched.returncode != 0:
        raise RuntimeError(f"apt-get download failed (run apt-get update first?):\n{fetched.stderr[-2000:]}")
    log(f"{len(names)} Debian packages: {' '.join(names)}")
    return names
