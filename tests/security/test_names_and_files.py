"""Security table rows 33 and 22: names that shadow models, keys born expired, and the modes of the state on disk.

Through the real daemon: the admin API (its Unix socket), the console (signed in, with its CSRF
token) and ``appliancectl`` each try to alias an installed model's or a catalog family's name and to
create a key that expires in the past. The daemon runs with the umask of a shell (022) and must
still keep its data dir, database, WAL, shared memory and log to its own user, also for files an
older build left world-readable.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import httpx
import pytest

from appliance.catalog import load_catalog
from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

ADMIN_PASSWORD = "names-and-files-passphrase-9"
INSTALLED = "gemma-3-270m:q4_k_m"


@pytest.fixture(scope="module")
def names_daemon(tmp_path_factory: pytest.TempPathFactory):
    old = os.umask(0o022)  # a shell's umask: the daemon must not rely on a careful one
    try:
        running = start_daemon(tmp_path_factory.mktemp("names"))
    finally:
        os.umask(old)
    with running.admin() as admin:
        r = admin.post("/admin/users/", json={"username": "namer", "password": ADMIN_PASSWORD, "role": "admin"})
        assert r.status_code in (200, 201), r.text
    yield running
    running.stop()


def _uninstalled_catalog_family() -> str:
    installed_family = INSTALLED.split(":")[0]
    return next(name for name in sorted(load_catalog().families) if name != installed_family)


def _aliases(daemon: RunningDaemon) -> dict[str, str]:
    with daemon.admin() as admin:
        return admin.get("/admin/aliases/").json()


def _console(daemon: RunningDaemon) -> tuple[httpx.Client, str]:
    """A signed-in admin console client and its session's CSRF token."""
    client = httpx.Client(base_url=daemon.url, timeout=60)
    form = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
    signed = client.post("/login", data={"username": "namer", "password": ADMIN_PASSWORD, "csrf_token": token})
    assert signed.status_code == 303 and signed.headers["location"] == "/", signed.text[:300]
    page = client.get("/aliases")
    csrf = re.search(r'"X-CSRF-Token": "([^"]+)"', page.text).group(1)
    return client, csrf


@pytest.mark.parametrize("name", ["gemma-3-270m", "GEMMA-3-270M", "Gemma-3-270m", "catalog-family"])
def test_the_admin_api_refuses_an_alias_that_shadows_a_model(names_daemon: RunningDaemon, name: str) -> None:
    if name == "catalog-family":
        name = _uninstalled_catalog_family()
    with names_daemon.admin() as admin:
        response = admin.put(f"/admin/aliases/{name}", json={"target": INSTALLED})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "alias_shadows_model" and error["param"] == "name" and name in error["message"]
    assert name not in _aliases(names_daemon)


def test_a_free_alias_name_is_still_accepted(names_daemon: RunningDaemon) -> None:
    with names_daemon.admin() as admin:
        response = admin.put("/admin/aliases/support-bot", json={"target": "gemma-3-270m"})
    assert response.status_code == 200, response.text
    assert _aliases(names_daemon)["support-bot"] == INSTALLED


def test_the_console_refuses_an_alias_that_shadows_a_model(names_daemon: RunningDaemon) -> None:
    client, csrf = _console(names_daemon)
    try:
        response = client.post(
            "/aliases/set",
            data={"name": "gemma-3-270m", "target": INSTALLED},
            headers={"X-CSRF-Token": csrf, "HX-Request": "true"},
        )
    finally:
        client.close()
    assert response.status_code in (200, 400), response.text[:300]
    assert "may not hide it" in response.text
    assert "gemma-3-270m" not in _aliases(names_daemon)


@pytest.mark.parametrize("days", [-3, -0.0001, 1e308])
def test_the_admin_api_refuses_a_key_that_expires_in_the_past(names_daemon: RunningDaemon, days: float) -> None:
    name = f"born-expired-{days}"
    with names_daemon.admin() as admin:
        response = admin.post("/admin/keys/", json={"name": name, "expires_in_days": days})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "expires_in_days"
        assert "secret" not in response.text
        assert name not in [k["name"] for k in admin.get("/admin/keys/").json()]


def test_a_key_cannot_be_changed_to_expire_in_the_past(names_daemon: RunningDaemon) -> None:
    with names_daemon.admin() as admin:
        created = admin.post("/admin/keys/", json={"name": "to-update", "expires_in_days": 5}).json()
        response = admin.put(f"/admin/keys/{created['id']}", json={"expires_in_days": -1})
        assert response.status_code == 400, response.text
        row = next(k for k in admin.get("/admin/keys/").json() if k["id"] == created["id"])
    assert row["expires_at"] == created["expires_at"]


def test_the_cli_refuses_a_negative_expiry_and_prints_no_secret(names_daemon: RunningDaemon) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "keys", "create", "cli-born-expired", "--expires-in-days", "-3"],
        env=names_daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result.stdout
    assert "ak_" not in result.stdout + result.stderr and "Store the secret" not in result.stdout
    with names_daemon.admin() as admin:
        assert "cli-born-expired" not in [k["name"] for k in admin.get("/admin/keys/").json()]


def test_the_console_refuses_a_negative_expiry(names_daemon: RunningDaemon) -> None:
    client, csrf = _console(names_daemon)
    try:
        response = client.post(
            "/keys/create",
            data={"name": "console-born-expired", "expires_in_days": "-3"},
            headers={"X-CSRF-Token": csrf, "HX-Request": "true"},
        )
    finally:
        client.close()
    assert response.status_code == 400, response.text[:300]
    with names_daemon.admin() as admin:
        assert "console-born-expired" not in [k["name"] for k in admin.get("/admin/keys/").json()]


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _state_files(data_dir) -> list:
    db = data_dir / "appliance.db"
    return [db, db.with_name("appliance.db-wal"), db.with_name("appliance.db-shm"), data_dir / "logs" / "appliance.log"]


def test_state_is_private_under_a_shell_umask(names_daemon: RunningDaemon) -> None:
    data_dir = names_daemon.data_dir
    assert _mode(data_dir) == 0o700
    assert _mode(data_dir / "logs") == 0o700
    for path in _state_files(data_dir):
        assert path.exists(), path
        assert _mode(path) == 0o600, (path, oct(_mode(path)))


def test_world_readable_state_of_an_older_build_is_tightened_at_start(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        running = start_daemon(tmp_path)
        running.create_key("leaves-a-wal")
        running.kill()  # SIGKILL: the WAL and shared-memory files stay behind, as after a crash
        data_dir = running.data_dir
        os.chmod(data_dir, 0o755)
        os.chmod(data_dir / "logs", 0o755)
        for path in _state_files(data_dir):
            assert path.exists(), path
            os.chmod(path, 0o644)
        running.start()
    finally:
        os.umask(old)
    try:
        assert _mode(data_dir) == 0o700
        for path in _state_files(data_dir):
            assert _mode(path) == 0o600, (path, oct(_mode(path)))
    finally:
        running.stop()
