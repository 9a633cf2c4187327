"""``install.sh --make-bundle FILE``: everything a box of this OS and CPU needs, in one verified archive.

Run on a connected machine with the Python of a build venv (install.sh makes one). The bundle holds
``src/`` (the files git would commit, the manual built in), ``wheels/`` (the project and every runtime
dependency as wheels, the default model's packages and llama-cpp-python built for the flavour asked for
among them, and the build backend, so a later bundle made ``--wheels-from`` this one needs no network),
``debs/`` (:mod:`appliance.release.debs`) and ``manifest.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from datetime import UTC, datetime
from pathlib import Path

from appliance.release import archive, debs
from appliance.release.manifest import MANIFEST_NAME, Log, Manifest, Member, describe_members, this_platform, verify

# What a source copy leaves out when git cannot list the tracked files.
_UNTRACKED = shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "__pycache__", "appliance-data", "test-artifacts")


def copy_sources(repo: Path, target: Path) -> None:
    """The files git would commit (tracked and new files not ignored); without git, the tree minus venvs and build output."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, text=True
    )
    if listed.returncode != 0 or not (repo / ".git").exists():
        shutil.copytree(repo, target, ignore=_UNTRACKED, symlinks=True)
        return
    for name in filter(None, listed.stdout.split("\0")):
        source = repo / name
        if source.is_file():
            dest = target / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


def set_version(src: Path, suffix: str) -> str:
    """Append ``suffix`` (a PEP 440 tail such as ``.post1``) to the version in pyproject.toml and the package; the new version."""
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    found = re.search(r'^version = "([^"]+)"', text, re.M)
    if found is None:
        raise RuntimeError(f"no version in {pyproject}")
    version = found.group(1) + suffix
    if not suffix:
        return version
    pyproject.write_text(text[: found.start(1)] + version + text[found.end(1) :])
    init = src / "appliance" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{version}"', init.read_text()))
    return version


def _step(label: str, argv: list[str], log: Log = print) -> None:
    started = time.monotonic()
    log(f"{label} ...")
    # PYTHONPATH brought these modules from the sources; pip would take the checkout's egg-info for an installed project.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(argv, check=True, env=env)
    log(f"{label}: {time.monotonic() - started:.0f} s")


def reuse_wheels(bundle: Path, stage: Path, wheels: Path, debs_dir: Path, log: Log = print) -> Manifest:
    """Take the dependency wheels, the engine and the Debian packages from an earlier, verified bundle; its manifest."""
    started = time.monotonic()
    folder = stage / "earlier"
    folder.mkdir()
    archive.unpack(bundle, folder)
    earlier = verify(folder)
    log(f"{bundle} unpacked and verified: {time.monotonic() - started:.0f} s")
    shutil.move(folder / "wheels", wheels)
    for project in wheels.glob("llm_appliance-*.whl"):
        project.unlink()
    if (folder / "debs").is_dir():
        shutil.move(folder / "debs", debs_dir)
    shutil.rmtree(folder)
    return earlier


def make(
    repo: Path, dest: Path, suffix: str = "", with_debs: bool = True, wheels_from: Path | None = None, log: Log = print
) -> Manifest:
    """Make the bundle ``dest`` from the sources in ``repo``; with ``wheels_from``, offline from an earlier bundle's wheels."""
    started = time.monotonic()
    python = sys.executable
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".bundle-", dir=dest.parent))
    try:
        root, src, wheels = stage / "bundle", stage / "bundle" / "src", stage / "bundle" / "wheels"
        copy_sources(repo, src)
        version = set_version(src, suffix)
        _step("Building the manual into the sources", [str(repo / "tools/build_manual.sh"), python, str(src)], log)
        pip_wheel = [python, "-m", "pip", "wheel", "-q", "-w", str(wheels), "--find-links", str(wheels)]
        verified: tuple[Member, ...] = ()
        if wheels_from is not None:
            log(f"Dependencies, engine and Debian packages from {wheels_from}")
            earlier = reuse_wheels(wheels_from, stage, wheels, root / "debs", log)
            names: tuple[str, ...] | list[str] = earlier.debs
            verified = earlier.members
            pip_wheel.append("--no-index")
        else:
            wheels.mkdir(parents=True)
            engine_build = [str(repo / "tools/engine_build.sh"), "--python", python, "--wheel-dir", str(wheels)]
            _step("llama-cpp-python for this bundle's flavour", engine_build, log)
            # The build backend too, so a later bundle made --wheels-from this one builds the project with no network.
            build_requires = tomllib.loads((src / "pyproject.toml").read_text())["build-system"]["requires"]
            download = [python, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(wheels)]
            _step("Build backend", [*download, *build_requires], log)
        engine = json.loads((wheels / "engine.json").read_text())
        build = stage / "build-src"  # pip builds a local project in place: build from a copy so src/ stays as committed
        shutil.copytree(src, build)
        _step("Wheels of the appliance and its dependencies", [*pip_wheel, str(build)], log)
        if wheels_from is None:
            names = debs.download(root / "debs", log) if with_debs else []
        manifest = Manifest(
            version=version,
            flavour=str(engine["flavour"]),
            platform=this_platform(),
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            build_id=uuid.uuid4().hex[:12],
            members=describe_members(root, verified),
            debs=tuple(names),
            extra={"llama_cpp_python": str(engine["version"]), "cmake_args": str(engine["cmake_args"])},
        )
        (root / MANIFEST_NAME).write_text(manifest.to_json())
        packing = time.monotonic()
        log(f"Manifest written: {len(manifest.members)} members")
        digest = archive.pack(root, dest)
        log(f"Packed in {time.monotonic() - packing:.0f} s")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    size = dest.stat().st_size
    log(
        f"Bundle {dest}: appliance {manifest.version}, {manifest.flavour} engine, for {manifest.platform.describe()}; "
        f"{len(manifest.members)} members, {size / 1e6:.0f} MB, made in {time.monotonic() - started:.0f} s"
    )
    log(f"sha256 {digest}  (compare it on the box before installing)")
    return manifest
