"""Security-table row 26: console sign-in throttling that cannot lock the real admin out; password policy.

Through the real daemon. Requests appear to come from different client
addresses by binding the client socket to other loopback addresses
(127.0.0.0/8 is all local on Linux; the daemon listens on 127.0.0.1).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

ADMIN_PASSWORD = "a-long-admin-passphrase-77"


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("signin"))
    with running.admin() as admin:
        r = admin.post("/admin/users/", json={"username": "admin", "password": ADMIN_PASSWORD, "role": "admin"})
        if r.status_code == 409:  # the first-run admin exists already
            r = admin.put("/admin/users/admin/password", json={"password": ADMIN_PASSWORD})
        assert r.status_code in (200, 201), r.text
    yield running
    running.stop()


def _from(daemon: RunningDaemon, address: str) -> httpx.Client:
    return httpx.Client(base_url=daemon.url, transport=httpx.HTTPTransport(local_address=address), timeout=30)


def _sign_in(client: httpx.Client, username: str, password: str) -> httpx.Response:
    form = client.get("/login")
    assert form.status_code == 200, form.text[:300]
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert token, form.text[:500]
    return client.post(
        "/login", data={"username": username, "password": password, "csrf_token": token.group(1)}, follow_redirects=False
    )


def _cli(daemon: RunningDaemon, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args], env=daemon.env, input=stdin, capture_output=True, text=True, timeout=60
    )


def test_failures_against_admin_from_many_addresses_do_not_lock_out_the_admin(console_daemon: RunningDaemon) -> None:
    # 24 wrong passwords for `admin`, one from each of 24 addresses (more than the old hard limit of 20).
    for i in range(24):
        with _from(console_daemon, f"127.0.0.{10 + i}") as client:
            r = _sign_in(client, "admin", f"wrong-guess-{i}")
            assert r.status_code == 401, (i, r.status_code, r.text[:300])
    # The real admin, from an address that has not failed, signs in at once.
    with _from(console_daemon, "127.0.0.99") as client:
        started = time.monotonic()
        r = _sign_in(client, "admin", ADMIN_PASSWORD)
        elapsed = time.monotonic() - started
        assert r.status_code == 303, r.text[:500]
        assert "appliance_session" in r.headers.get("set-cookie", "")
        assert elapsed < 10  # argon2 plus two requests on a loaded box; no throttling wait


def test_one_address_is_slowed_with_a_clear_message_and_unlock_clears_it(console_daemon: RunningDaemon) -> None:
    with _from(console_daemon, "127.0.0.50") as client:
        for i in range(3):
            assert _sign_in(client, "nobody-here", f"guess-{i}").status_code == 401
        r = _sign_in(client, "admin", ADMIN_PASSWORD)  # even the right password waits: the address is throttled
        assert r.status_code == 429
        wait = int(r.headers["retry-after"])
        assert 1 <= wait <= 2
        assert f"Too many failed sign-ins from this address; try again in {wait} s." in r.text
        assert "appliance_session" not in r.headers.get("set-cookie", "")
        for i in range(3):  # keep failing as soon as allowed: the wait doubles
            time.sleep(wait)
            assert _sign_in(client, "nobody-here", f"again-{i}").status_code == 401
            r = _sign_in(client, "nobody-here", "too-soon")
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) >= wait * 2 - 1
            wait = int(r.headers["retry-after"])
        assert wait >= 8
        done = _cli(console_daemon, "users", "unlock", "admin", "--address", "127.0.0.50")
        assert done.returncode == 0, done.stderr
        assert "Unlocked admin" in done.stdout
        r = _sign_in(client, "admin", ADMIN_PASSWORD)
        assert r.status_code == 303, r.text[:500]


@pytest.mark.parametrize(
    "password, reason",
    [
        ("password", "at least 12 characters"),
        ("Password2024!", "commonly used"),
        ("qwertyuiop123", "commonly used"),
        ("1qaz2wsx3edc4rfv", "keyboard walk"),
        ("aaaaaaaaaaaaaa", "repeated"),
        ("123456789012", "digits only"),
        ("admin1234567", "commonly used"),
        ("operator-2024", "user name"),
    ],
)
def test_weak_passwords_are_refused_with_the_reason(console_daemon: RunningDaemon, password: str, reason: str) -> None:
    with console_daemon.admin() as admin:
        r = admin.post("/admin/users/", json={"username": "operator", "password": password, "role": "operator"})
        assert r.status_code == 400, r.text
        assert reason in r.json()["error"]["message"] and r.json()["error"]["param"] == "password"
    done = _cli(console_daemon, "users", "create", "operator", "--role", "operator", "--password-stdin", stdin=password + "\n")
    assert done.returncode != 0 and reason in done.stderr, (done.stdout, done.stderr)


def test_cli_creates_a_user_and_sets_a_password(console_daemon: RunningDaemon, tmp_path: Path) -> None:
    done = _cli(
        console_daemon, "users", "create", "olivia", "--role", "operator", "--password-stdin", stdin="olivia-first-passphrase\n"
    )
    assert done.returncode == 0, done.stderr
    done = _cli(console_daemon, "users", "passwd", "olivia", "--password-stdin", stdin="olivia-second-passphrase\n")
    assert done.returncode == 0, done.stderr
    with _from(console_daemon, "127.0.0.70") as client:
        assert _sign_in(client, "olivia", "olivia-first-passphrase").status_code == 401
    with _from(console_daemon, "127.0.0.71") as client:
        assert _sign_in(client, "olivia", "olivia-second-passphrase").status_code == 303
