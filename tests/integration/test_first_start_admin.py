"""A daemon started on an empty data dir, without the installer, still has a way in.

It creates the `admin` user with a one-time password kept in
``<data dir>/initial-admin-password`` (0600), its log names the file and never
the password, ``appliancectl users initial-password`` prints it, the sign-in
page names that command, and once the admin has chosen their own password the
next start removes the file.
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys

import httpx
import pytest

from appliance.accounts.users import set_password
from appliance.db import engine as dbmod
from tests.daemon import start_daemon

pytestmark = pytest.mark.slow


def _sign_in(url: str, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as client:
        form = client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert token, form.text[:500]
        return client.post(
            "/login", data={"username": username, "password": password, "csrf_token": token.group(1)}, follow_redirects=False
        )


def _ctl(box, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args], env=box.env, capture_output=True, text=True, timeout=120
    )


def test_a_bare_daemon_creates_the_first_admin_and_says_where_its_password_is(tmp_path):
    box = start_daemon(tmp_path)
    saved = box.data_dir / "initial-admin-password"
    try:
        assert saved.is_file(), f"no one-time password file after a bare start:\n{box.log()[-2000:]}"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        password = saved.read_text().strip()
        assert len(password) >= 12
        log = box.log()
        assert str(saved) in log, log[-2000:]
        assert password not in log, "the daemon logged the one-time password"

        shown = _ctl(box, "users", "initial-password")
        assert shown.returncode == 0, shown.stderr
        assert password in shown.stdout

        page = httpx.get(box.url + "/login", timeout=30).text
        assert "appliancectl users initial-password" in page

        first = _sign_in(box.url, "admin", password)
        assert first.status_code == 303 and first.headers["location"] == "/password", first.text[:300]
        assert _sign_in(box.url, "ADMIN ", password + "x").status_code != 303
    finally:
        box.stop()

    engine = dbmod.make_engine(box.data_dir / "appliance.db")
    try:
        set_password(engine, "admin", "Quiet-harbour-lantern-92")  # the admin chooses their own
    finally:
        engine.dispose()
    box.start()
    try:
        assert not saved.exists(), "the one-time password file outlived the password"
        assert box.log().count("created `admin`") == 1, "a second start created another admin"
        gone = _ctl(box, "users", "initial-password")
        assert gone.returncode != 0 and "passwd admin" in gone.stderr
        assert _sign_in(box.url, "admin", "Quiet-harbour-lantern-92").status_code == 303
    finally:
        box.stop()
