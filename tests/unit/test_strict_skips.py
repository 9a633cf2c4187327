"""Strict mode turns a skip that could have run into a failure, and lists the ones that could not."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CASES = """
import pytest
from tests.strict_skips import impossible_here

def test_plain_skip():
    pytest.skip("some tool is missing")

def test_impossible_here():
    impossible_here("no GPU on this box")

def test_passes():
    assert True
"""


def _run(tmp_path: Path, strict: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from tests.strict_skips import *  # noqa\n"
        "from tests.strict_skips import pytest_make_collect_report, "
        "pytest_runtest_makereport, pytest_terminal_summary  # noqa\n"
    )
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {**os.environ, "PYTHONPATH": str(REPO), "APPLIANCE_STRICT_SKIPS": "1" if strict else "0"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_strict_mode_fails_unexplained_skips_and_lists_the_rest(tmp_path):
    result = _run(tmp_path, strict=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 skipped" in result.stdout
    assert "strict mode without a reason that cannot hold here: some tool is missing" in result.stdout
    assert "cannot run on this machine" in result.stdout and "no GPU on this box" in result.stdout


def test_without_strict_mode_skips_stay_skips(tmp_path):
    result = _run(tmp_path, strict=False)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 2 skipped" in result.stdout
