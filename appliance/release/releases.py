"""Releases side by side: ``<prefix>/releases/<version>``, with ``current`` and ``previous`` links beside them.

A verified bundle is unpacked into ``releases/.incoming-*``, checked (:func:`appliance.release.manifest.verify`),
renamed to ``releases/<version>``, and its venv is built there from the bundle's wheels alone (``pip install
--no-index``, no pip configuration, no cache). ``current`` is switched with one rename, so a reader sees the old
release or the new one, never a mix; ``<prefix>/venv`` and ``<prefix>/src`` are links through ``current``, so
the unit file's ``/opt/appliance/venv/bin/applianced`` starts whichever release is current.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.release import archive
from appliance.release.manifest import BundleRefused, Log, Manifest, verify

PROJECT = "llm-appliance"


class AlreadyCurrent(BundleRefused):
    """The bundle's release (the same build) is the current one: nothing to unpack."""


@dataclass(frozen=True)
class Layout:
    prefix: Path

    @property
    def releases(self) -> Path:
        return self.prefix / "releases"

    @property
    def current(self) -> Path:
        return self.prefix / "current"

    @property
    def previous(self) -> Path:
        return self.prefix / "previous"

    def release(self, version: str) -> Path:
        return self.releases / version

    def version_of(self, link: Path) -> str | None:
        """The version a link (``current``, ``previous``) points at, or None when there is none."""
        if not link.is_symlink():
            return None
        target = self.releases / os.readlink(link).rsplit("/", 1)[-1]
        return target.name if (target / "venv" / "bin" / "python").exists() else None


def read_manifest(release: Path) -> Manifest:
    return Manifest.from_json((release / "manifest.json").read_text())


def unpack_verified(bundle: Path, layout: Layout) -> tuple[Manifest, Path]:
    """Unpack and verify ``bundle`` into ``releases/<version>``; the running release is never replaced."""
    layout.releases.mkdir(parents=True, exist_ok=True)
    incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=layout.releases))
    try:
        archive.unpack(bundle, incoming)
        manifest = verify(incoming)
        target = layout.release(manifest.version)
        if target.exists():
            if layout.version_of(layout.current) == manifest.version:
                if read_manifest(target).build_id == manifest.build_id:
                    raise AlreadyCurrent(f"appliance {manifest.version} from this bundle is the current release already")
                raise BundleRefused(
                    f"version {manifest.version} is the current release, from another build; give the new one a new version"
                )
            shutil.rmtree(target)
        os.chmod(incoming, 0o755)
        os.rename(incoming, target)
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    return manifest, target


def missing_debs(release: Path) -> list[Path]:
    """The bundle's Debian packages that are not installed on this box."""
    found = []
    for deb in sorted((release / "debs").glob("*.deb")):
        name = subprocess.run(["dpkg-deb", "-f", str(deb), "Package"], capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", name], capture_output=True, text=True).stdout
        if status.strip() != "install ok installed":
            found.append(deb)
    return found


def install_debs(release: Path, log: Log = print) -> None:
    if not (release / "debs").is_dir() or shutil.which("dpkg") is None:
        return
    missing = missing_debs(release)
    if not missing:
        log("The Debian packages the appliance needs are installed.")
        return
    if os.geteuid() != 0:
        raise BundleRefused(
            f"{len(missing)} Debian packages are missing ({', '.join(d.name for d in missing)}); run as root once"
        )
    log(f"Installing {len(missing)} Debian packages from the bundle: {' '.join(d.name.split('_')[0] for d in missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["dpkg", "-i", *map(str, missing)], check=True, env=env, stdout=subprocess.DEVNULL)


def offline_pip_env() -> dict[str, str]:
    """The environment for pip with no configuration of the host's: no index, no find-links, no cache from elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    return env


def build_venv(release: Path, manifest: Manifest, log: Log = print) -> Path:
    """``<release>/venv`` with the appliance installed from ``<release>/wheels`` only; the wheels are removed after.

    The venv is made from the system's Python (the base interpreter of the one running, when that is a venv's)."""
    venv = release / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    log(f"Preparing {venv} from the bundle's wheels (no network)")
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(release / "wheels"),
            f"{PROJECT}=={manifest.version}",
        ],
        check=True,
        env=offline_pip_env(),
    )
    record = {
        "flavour": manifest.flavour,
        "version": manifest.extra.get("llama_cpp_python", ""),
        "from_bundle": manifest.build_id,
    }
    (venv / "appliance-engine.json").write_text(json.dumps(record) + "\n")
    shutil.rmtree(release / "wheels", ignore_errors=True)  # installed; the manifest and src/ stay as the record
    shutil.rmtree(release / "debs", ignore_errors=True)
    return venv


def _link(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one rename (a real folder in its place, from a source install, is removed first)."""
    if link.exists() and not link.is_symlink():
        shutil.rmtree(link)
    fresh = link.with_name(link.name + ".new")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(target)
    os.replace(fresh, link)


def switch(layout: Layout, version: str) -> str | None:
    """Make ``version`` current (the one it replaces becomes ``previous``); the replaced version or None."""
    before = layout.version_of(layout.current)
    if before is not None and before != version:
        _link(layout.previous, f"releases/{before}")
    _link(layout.current, f"releases/{version}")
    _link(layout.prefix / "venv", "current/venv")
    _link(layout.prefix / "src", "current/src")
    return before


def prune(layout: Layout) -> list[str]:
    """Remove releases other than ``current`` and ``previous``; the versions removed."""
    keep = {layout.version_of(layout.current), layout.version_of(layout.previous)}
    removed = []
    for release in sorted(layout.releases.iterdir()) if layout.releases.is_dir() else []:
        if release.name not in keep:
            shutil.rmtree(release, ignore_errors=True)
            removed.append(release.name)
    return removed


def install(bundle: Path, layout: Layout, debs: bool = True, log: Log = print) -> Manifest:
    """Verify, unpack, install the missing Debian packages, build the venv and make the release current."""
    try:
        manifest, release = unpack_verified(bundle, layout)
    except AlreadyCurrent as exc:
        log(exc.reason)
        current = layout.version_of(layout.current)
        assert current is not None
        return read_manifest(layout.release(current))
    log(
        f"Bundle verified: appliance {manifest.version} ({manifest.flavour} engine) for {manifest.platform.describe()}, "
        f"{len(manifest.members)} members"
    )
    try:
        if debs:
            install_debs(release, log)
        build_venv(release, manifest, log=log)
    except BaseException:
        shutil.rmtree(release, ignore_errors=True)
        raise
    switch(layout, manifest.version)
    prune(layout)
    return manifest


_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?(?:\+[a-z0-9.]+)?", re.I)


def version_key(version: str) -> tuple[tuple[int, ...], int, int, int, int]:
    """An ordering key for the PEP 440 versions releases carry (N.N.N, aN/bN/rcN, .postN, .devN)."""
    found = _VERSION.fullmatch(version.strip())
    if found is None:
        raise BundleRefused(f"version {version!r} is not a version number this installer can order")
    release = tuple(int(p) for p in found.group(1).split("."))
    release += (0,) * (6 - len(release))
    pre = {"a": -3, "b": -2, "rc": -1}.get((found.group(2) or "").lower(), 0)
    dev = int(found.group(5)) if found.group(5) is not None else 1 << 30
    return release, pre, int(found.group(3) or 0), int(found.group(4) or -1), dev


def is_newer(candidate: str, current: str) -> bool:
    return version_key(candidate) > version_key(current)
