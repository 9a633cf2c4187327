"""tests/gpu/check.sh is run by hand on GPU hosts; here it must at least parse, and its Python part import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_shell_script_is_valid_bash_and_executable():
    script = ROOT / "tests" / "gpu" / "check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert os.access(script, os.X_OK)


def test_the_python_part_imports_and_answers_help():
    from tests.gpu import check

    assert callable(check.main) and check.default_model()
    done = subprocess.run(
        [sys.executable, "-m", "tests.gpu.check", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--catalog-model" in done.stdout
