"""Shared pytest fixtures, and strict mode for skips (tests/strict_skips.py)."""

from tests.daemon import *  # noqa
from tests.fixtures_models import *  # noqa
from tests.strict_skips import pytest_make_collect_report, pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401
