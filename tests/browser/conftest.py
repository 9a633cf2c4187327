"""Browser tests: headless Chromium (Playwright) against the real daemon.

Chromium comes from the distribution (``/usr/bin/chromium``); Playwright only
drives it. Every page a test opens collects console errors, page errors and
CSP violations, and the test fails if there were any. Screenshots go to
``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.daemon import RunningDaemon, start_daemon

CHROMIUM = Path(os.environ.get("APPLIANCE_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
DOCS_SHOTS = ROOT / "docs" / "screenshots"
WIDE, NARROW = 1280, 390

USERS = {  # name: (role, password)
    "alice": ("admin", "alice-password-1"),
    "otto": ("operator", "otto-password-1"),
    "victor": ("viewer", "victor-password-1"),
}

playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")


@pytest.fixture(scope="session")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    base = tmp_path_factory.mktemp("console")
    config = base / "appliance.toml"  # a config file, as installs have, so settings can be changed from the console
    config.write_text("# the console tests' daemon\n")
    # The batch holdback off: the interactive requests of earlier tests miss their latency targets on a busy test box,
    # and with it on, a batch made later would start no line for up to five minutes.
    running = start_daemon(
        base,
        APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]',
        APPLIANCE_CONFIG=str(config),
        APPLIANCE_BATCH_HOLDBACK_ATTAINMENT="0",
    )
    running.config_file = config
    engine = make_engine(running.data_dir / "appliance.db")
    # The daemon made `admin` on its empty data dir, as the installer would: its one-time password is in this file.
    running.initial_password = (running.data_dir / "initial-admin-password").read_text().strip()
    for name, (role, password) in USERS.items():
        create_user(engine, name, password, role=role)
    engine.dispose()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it
    is open, which would break every later test that calls asyncio.run()."""
    if not CHROMIUM.exists():
        message = f"no Chromium at {CHROMIUM} (./test.sh installs it: apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Session:
    """A signed-in browser context and its first page; collects console errors."""

    page: object
    context: object
    base: str
    errors: list[str] = field(default_factory=list)

    def goto(self, path: str) -> object:
        response = self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")
        return response

    def csrf(self) -> str:
        return self.page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")

    def shoot(self, name: str, *, docs: bool = False) -> None:
        """Screenshots at 1280 and 390 px wide; assert no horizontal overflow at either."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        for width in (WIDE, NARROW):
            self.page.set_viewport_size({"width": width, "height": 900})
            self.page.wait_for_timeout(150)
            overflow = self.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            path = SHOTS / f"{name}-{width}.png"
            self.page.screenshot(path=str(path), full_page=True)
            assert overflow <= 0, f"{name} overflows by {overflow}px at {width}px"
            if docs and width == WIDE and os.environ.get("APPLIANCE_UPDATE_SCREENSHOTS"):  # refresh the README's pictures
                DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, DOCS_SHOTS / f"{name}.png")
        self.page.set_viewport_size({"width": WIDE, "height": 900})


def _watch(page: object, errors: list[str]) -> None:
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: d.accept())


def sign_in(page: object, base: str, username: str, password: str) -> object:
    page.goto(base + "/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
    return page


@pytest.fixture
def signed_in(chromium: object, console_daemon: RunningDaemon) -> Iterator[callable]:
    sessions: list[Session] = []

    def make(username: str = "alice") -> Session:
        context = chromium.new_context(viewport={"width": WIDE, "height": 900})
        page = context.new_page()
        session = Session(page=page, context=context, base=console_daemon.url)
        _watch(page, session.errors)
        sign_in(page, console_daemon.url, username, USERS[username][1])
        page.wait_for_load_state("networkidle")
        sessions.append(session)
        return session

    yield make
    problems = [e for s in sessions for e in s.errors]
    for s in sessions:
        s.context.close()
    assert not problems, "the console logged errors:\n" + "\n".join(problems)
