"""The unit file passes systemd's own verifier, scores 2.5 or better on exposure, and ships with the package."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "appliance.service"

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (test.sh installs it)"
)


def _unit_with_real_binary(tmp_path: Path) -> Path:
    # verify checks that ExecStart exists; point it at a binary that does on this machine.
    text = UNIT.read_text().replace("/opt/appliance/venv/bin/applianced", "/bin/true")
    out = tmp_path / "appliance.service"
    out.write_text(text)
    return out


@needs_analyze
def test_unit_verifies(tmp_path):
    result = subprocess.run(["systemd-analyze", "verify", str(_unit_with_real_binary(tmp_path))], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "appliance.service" not in result.stderr, result.stderr


@needs_analyze
def test_unit_security_score(tmp_path):
    unit = _unit_with_real_binary(tmp_path)
    # systemd 252 takes the threshold in tenths: 25 means an exposure of 2.5.
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--threshold=25", str(unit)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-2000:]
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout).group(1))
    assert score <= 2.5


def test_unit_shape():
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "User=appliance",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=/dev/kfd rw",
        "DeviceAllow=char-drm rw",
    ):
        assert line in text, line


ROOT = Path(__file__).resolve().parents[2]


def _installed_copy(site_packages: Path) -> None:
    """Lay out the `appliance` package as a non-editable install does: each declared package's modules
    (from its folder under setuptools' package-dir) plus its declared package data."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping, data = config["package-dir"], config["package-data"]

    def folder(package: str) -> Path:
        base = max((p for p in mapping if package == p or package.startswith(p + ".")), key=len)
        return (
            ROOT / mapping[base] / Path(*package[len(base) :].lstrip(".").split(".")) if package != base else ROOT / mapping[base]
        )

    for package in config["packages"]:
        source = folder(package)
        target = site_packages / Path(*package.split("."))
        files = set(source.glob("*.py"))
        for pattern in data.get(package, ()):
            files |= {p for p in source.glob(pattern) if p.is_file()}
        for path in files:
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def test_unit_is_found_from_an_installed_layout(tmp_path):
    # The tree install.sh --system leaves: /opt/appliance/src (a copy of the sources) and a venv
    # with the package installed into site-packages, far from any systemd/ folder.
    prefix = tmp_path / "opt" / "appliance"
    site = prefix / "venv" / "lib" / "python3.11" / "site-packages"
    _installed_copy(site)
    # no <prefix>/src here: the installed package alone must carry the unit
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    probe = "import appliance.cli.setup as s; print(s.__file__); print(s.unit_source())"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    module, unit = result.stdout.split()
    assert module == str(site / "appliance" / "cli" / "setup.py")  # the copy, not the editable checkout
    assert unit == str(site / "appliance" / "systemd" / "appliance.service")
    assert Path(unit).read_text() == UNIT.read_text()


def test_unit_lookup_falls_back_to_the_copied_sources(tmp_path):
    from appliance.cli.setup import unit_source

    prefix = tmp_path / "opt" / "appliance"
    package = prefix / "venv" / "lib" / "python3.11" / "site-packages" / "appliance"
    package.mkdir(parents=True)
    shutil.copytree(ROOT / "systemd", prefix / "src" / "systemd")
    assert unit_source(package, prefix) == prefix / "src" / "systemd" / "appliance.service"
    shutil.rmtree(prefix / "src")
    with pytest.raises(click.ClickException, match="appliance.service not found"):
        unit_source(package, prefix)
