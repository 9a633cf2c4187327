"""Strict mode for skips (``APPLIANCE_STRICT_SKIPS=1``, which ``./test.sh`` sets).

A skip hides a failure unless what the test needs cannot exist on this
machine. In strict mode every skip is turned into a failure unless its reason
starts with ``impossible here:`` (a GPU-only check on a box without a GPU, a
permission check that root passes by definition); those are listed at the end
of the run, so nobody has to guess what did not run and why.
"""

from __future__ import annotations

import os

import pytest

IMPOSSIBLE_HERE = "impossible here:"
STRICT = os.environ.get("APPLIANCE_STRICT_SKIPS") == "1"


def impossible_here(why: str) -> None:
    """Skip a test whose premise cannot hold on this machine (allowed in strict mode)."""
    pytest.skip(f"{IMPOSSIBLE_HERE} {why}")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_explained: list[tuple[str, str]] = []


def _judge(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or (isinstance(report, pytest.TestReport) and hasattr(report, "wasxfail")):
        return
    reason = _reason(report)
    if reason.startswith(IMPOSSIBLE_HERE):
        _explained.append((report.nodeid, reason))
    elif STRICT:
        report.outcome = "failed"
        report.longrepr = f"skipped in strict mode without a reason that cannot hold here: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _judge(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _judge(outcome.get_result())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _explained:
        terminalreporter.section("skipped because they cannot run on this machine")
        for nodeid, reason in _explained:
            terminalreporter.line(f"{nodeid}: {reason}")
