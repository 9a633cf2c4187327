"""A real Debian bookworm with systemd as PID 1, booted with systemd-nspawn.

The root file system is made once with debootstrap and kept as a tarball in
``/root/.cache/appliance-tests/`` (named by the suite, mirror and package list),
so a rerun only unpacks it. :class:`Container` boots a fresh copy, runs commands
inside with ``nsenter`` and always tears down: the container is powered off
(killed if it does not stop), and its folder is removed only once nothing is
mounted below it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

SUITE = "bookworm"
VARIANT = "minbase"
# systemd as init, Python for the appliance, and what install.sh would otherwise
# apt-get itself (python3-dev, build-essential, cmake) so a warm run downloads nothing.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "python3-dev", "build-essential", "cmake")
CACHE = Path(os.environ.get("APPLIANCE_TEST_CACHE", "/root/.cache/appliance-tests"))
PIP_CACHE = Path("/root/.cache/pip")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Environment the commands inside get: PATH and locale, plus the host's pip and CA settings.
PASSED_ENV = re.compile(r"^(PIP_\w+|SSL_CERT_\w+|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|CMAKE_ARGS)$")


class CannotBoot(RuntimeError):
    """This machine cannot boot a container (the reason is the message)."""


def cannot_boot_reason() -> str | None:
    """Why a container cannot boot here, or None when it should."""
    if os.geteuid() != 0:
        return "booting a container with systemd-nspawn needs root"
    for tool, package in (
        ("debootstrap", "debootstrap"),
        ("systemd-nspawn", "systemd-container"),
        ("nsenter", "util-linux"),
        ("tar", "tar"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install {package}; test.sh installs it)"
    mounts = Path("/proc/self/mounts").read_text()
    if not any(line.split()[2] == "cgroup2" for line in mounts.splitlines() if len(line.split()) > 2):
        return "no cgroup v2 hierarchy is mounted, which systemd in the container needs"
    return None


def debian_mirror() -> str:
    """The Debian mirror the host's apt uses for the main archive (not -security)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            urls = []
            if line.startswith("deb ") and SUITE in line.split():
                urls = [w for w in line.split()[1:] if "://" in w][:1]
            elif line.startswith("URIs:"):
                urls = line.split()[1:]
            for url in urls:
                if url.rstrip("/").endswith("/debian") and "security" not in url:
                    return url.rstrip("/")
    return DEFAULT_MIRROR


def _run(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def rootfs_tarball(log=print) -> Path:  # type: ignore[no-untyped-def]
    """The cached tarball of the debootstrapped root, made on first use."""
    mirror = debian_mirror()
    key = hashlib.sha256("\n".join([SUITE, VARIANT, mirror, *PACKAGES]).encode()).hexdigest()[:16]
    tarball = CACHE / f"rootfs-{SUITE}-{key}.tar"
    if tarball.is_file():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="rootfs-build-", dir=CACHE))
    try:
        started = time.monotonic()
        log(f"debootstrap {SUITE} from {mirror} with {','.join(PACKAGES)} (cached as {tarball}) ...")
        result = _run(
            ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}", SUITE, str(build / "root"), mirror],
            timeout=900,
        )
        if result.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")
        shutil.rmtree(build / "root" / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (build / "root" / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        partial = tarball.with_name(tarball.name + f".{os.getpid()}.tmp")
        result = _run(["tar", "--numeric-owner", "--xattrs", "-C", str(build / "root"), "-cf", str(partial), "."], timeout=600)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"tar failed: {result.stderr[-2000:]}")
        partial.rename(tarball)
        log(f"root file system made in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return tarball


def _host_pip_paths() -> list[Path]:
    """Local folders the host's pip configuration points at (find-links, file:// indexes)."""
    texts = [v for k, v in os.environ.items() if k.startswith("PIP_")]
    for conf in (
        Path("/etc/pip.conf"),
        Path("/etc/xdg/pip/pip.conf"),
        Path.home() / ".config/pip/pip.conf",
        Path.home() / ".pip/pip.conf",
    ):
        if conf.is_file():
            texts.append(conf.read_text())
    found: list[Path] = []
    for word in re.findall(r"(?:file://)?(/[^\s'\"]+)", "\n".join(texts)):
        path = Path(word)
        while not path.exists() and path != path.parent:
            path = path.parent
        if path.name == "simple":
            path = path.parent  # a local index links to files beside its simple/ folder
        if (
            path.is_dir()
            and path != Path("/")
            and not str(path).startswith(("/etc", "/root", "/proc", "/sys", "/dev"))
            and not any(path == p or p in path.parents for p in found)
        ):
            found.append(path)
    return found


def _copy_host_config(root: Path) -> None:
    """The host's CA bundle and pip configuration, so pip inside reaches the same package index."""
    for path in (
        Path("/etc/ssl/certs/ca-certificates.crt"),
        Path("/etc/pip.conf"),
        Path("/etc/xdg/pip"),
        Path("/root/.config/pip"),
        Path("/root/.pip"),
    ):
        if not path.exists():
            continue
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(path, target)


def _mounts_below(folder: Path) -> list[str]:
    prefix = str(folder.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


class Container:
    """One booted container. Use as a context manager: teardown always runs."""

    def __init__(self, source_tree: Path, log=print, private_network: bool = False):  # type: ignore[no-untyped-def]
        """``private_network``: the container gets a network namespace with loopback only, and none of the host's
        package sources (pip's cache, local wheel folders) are bound in: nothing can be fetched inside."""
        self.source_tree = source_tree
        self.log = log
        self.private_network = private_network
        self.name = f"appliance-test-{uuid.uuid4().hex[:8]}"
        self.folder = Path(tempfile.mkdtemp(prefix="appliance-system-", dir="/var/tmp"))
        self.root = self.folder / "root"
        self.console_log = self.folder / "console.log"
        self.nspawn: subprocess.Popen | None = None
        self.pid1: int | None = None
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
        }
        if not private_network:
            self.env.update({k: v for k, v in os.environ.items() if PASSED_ENV.match(k)})

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self) -> Container:
        try:
            self.boot()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def boot(self, timeout: float = 120.0) -> None:
        tarball = rootfs_tarball(self.log)
        started = time.monotonic()
        self.root.mkdir()
        result = _run(["tar", "--numeric-owner", "--xattrs", "-C", str(self.root), "-xf", str(tarball)], timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"unpacking {tarball} failed: {result.stderr[-2000:]}")
        _copy_host_config(self.root)
        (self.root / "usr/src/appliance").mkdir(parents=True, exist_ok=True)
        argv = [
            "systemd-nspawn",
            "-D",
            str(self.root),
            "-b",
            "--register=no",
            "--keep-unit",
            f"--machine={self.name}",
            "--console=pipe",
            f"--bind-ro={self.source_tree}:/usr/src/appliance",
        ]
        if self.private_network:
            argv.append("--private-network")
        else:
            if PIP_CACHE.is_dir():
                argv.append(f"--bind={PIP_CACHE}:/root/.cache/pip")
            for path in _host_pip_paths():
                argv.append(f"--bind-ro={path}")
        self.log(f"booting: {' '.join(argv)}")
        with open(self.console_log, "wb") as out:
            self.nspawn = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while self.pid1 is None:
            if self.nspawn.poll() is not None:
                raise CannotBoot(f"systemd-nspawn exited with {self.nspawn.returncode}: {self.console()[-3000:]}")
            if time.monotonic() > deadline:
                raise CannotBoot(f"no PID 1 in the container after {timeout:.0f} s: {self.console()[-3000:]}")
            children = Path(f"/proc/{self.nspawn.pid}/task/{self.nspawn.pid}/children").read_text().split()
            for child in children:
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    self.pid1 = int(child)
            time.sleep(0.2)
        while True:
            state = self.sh("systemctl is-system-running", timeout=30, check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            if self.nspawn.poll() is not None or time.monotonic() > deadline:
                raise CannotBoot(f"systemd in the container did not finish booting (state {state!r}): {self.console()[-3000:]}")
            time.sleep(0.5)
        self.log(f"container {self.name} up (PID 1 is {self.pid1} on the host, {state}) in {time.monotonic() - started:.1f} s")

    def teardown(self) -> None:
        """Power off (or kill) the container, then remove its folder if nothing is mounted below it."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            if self.pid1 is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid1, signal.SIGRTMIN + 4)  # systemd: poweroff
            try:
                self.nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.nspawn.terminate()  # nspawn asks the container to stop, then gives up
                try:
                    self.nspawn.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.nspawn.kill()
                    self.nspawn.wait(timeout=10)
        for point in sorted(_mounts_below(self.folder), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        left = _mounts_below(self.folder)
        if left:
            raise RuntimeError(f"still mounted below {self.folder}, not removed: {left}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.folder)], capture_output=True)

    # -- inside ------------------------------------------------------------
    def console(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except OSError:
            return ""

    def sh(
        self, script: str, timeout: float = 120.0, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run a bash script inside the container as root, in all its namespaces."""
        assert self.pid1 is not None, "container not booted"
        environment = [f"{k}={v}" for k, v in {**self.env, **(env or {})}.items()]
        argv = ["nsenter", "-t", str(self.pid1), "-a", "--", "/usr/bin/env", "-i", *environment, "/bin/bash", "-c", script]
        result = _run(argv, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(
                f"inside the container `{script}` exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def popen(self, script: str, **kwargs) -> subprocess.Popen:  # type: ignore[no-untyped-def]
        assert self.pid1 is not None, "container not booted"
        environment = [f"{k}={v}" for k, v in self.env.items()]
        return subprocess.Popen(
            ["nsenter", "-t", str(self.pid1), "-a", "--", "/usr/bin/env", "-i", *environment, "/bin/bash", "-c", script], **kwargs
        )


def copy_source_tree(repo: Path, target: Path) -> Path:
    """The files git would commit (tracked, and new files not ignored), without .git, venvs or build output."""
    listed = _run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], timeout=60)
    if listed.returncode != 0:
        raise RuntimeError(f"git ls-files failed: {listed.stderr}")
    target.mkdir(parents=True, exist_ok=True)
    for name in filter(None, listed.stdout.split("\0")):
        source = repo / name
        if not source.is_file() or source.is_symlink() and not source.exists():
            continue  # deleted in the working tree
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest, follow_symlinks=False)
    return target
