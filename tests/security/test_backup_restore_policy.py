"""Security table row 22: backups cannot write files outside the backups folder, restores cannot plant anything.

Backups: only ``<data dir>/backups/NAME`` (a plain name), never replacing a file,
mode 0600 in a 0700 folder. Restores: only from that folder for a remote admin
key (any readable file from the local admin socket), and only after the file's
integrity and exact schema were checked on a private copy; a refused file
leaves the live database serving as it was. All through a real daemon.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from pathlib import Path

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory):
    running = start_daemon(tmp_path_factory.mktemp("backup-policy"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def remote_admin(d: RunningDaemon) -> httpx.Client:
    with d.client(d.create_key("remote-admin", role="admin")) as client:
        yield client


@pytest.fixture(scope="module")
def good_backup(d: RunningDaemon) -> Path:
    """A backup made through the API; tests copy it and tamper with the copies."""
    with d.admin() as admin:
        response = admin.post("/admin/ops/backup", json={"name": "pristine.db"})
    assert response.status_code == 200, response.text
    return Path(response.json()["path"])


def backups(d: RunningDaemon) -> Path:
    return d.data_dir / "backups"


def key_works(d: RunningDaemon, key: str) -> bool:
    status = httpx.get(d.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code
    assert status in (200, 401), status
    return status == 200


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith("appliance.db-")}


# ---------------------------------------------------------------- backups
def test_backup_is_0600_in_a_0700_folder_and_named_by_the_server(d: RunningDaemon, remote_admin: httpx.Client) -> None:
    response = remote_admin.post("/admin/ops/backup", json={})
    assert response.status_code == 200, response.text
    made = Path(response.json()["path"])
    assert made.parent == backups(d) and made.name.startswith("backup-") and made.name.endswith(".db")
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(backups(d).stat().st_mode) == 0o700
    conn = sqlite3.connect(made)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    # a path is accepted when it names a file directly in the backups folder
    response = remote_admin.post("/admin/ops/backup", json={"path": str(backups(d) / "by-path.db")})
    assert response.status_code == 200, response.text
    assert stat.S_IMODE((backups(d) / "by-path.db").stat().st_mode) == 0o600


def test_backup_to_dev_null_is_refused_and_dev_null_stays_a_device(d: RunningDaemon) -> None:
    with d.admin() as admin:
        response = admin.post("/admin/ops/backup", json={"path": "/dev/null"})
    assert response.status_code == 400, response.text
    assert "backups are kept only in" in response.json()["error"]["message"]
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not os.path.exists("/dev/null.partial")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "../x"},
        {"name": "a/b"},
        {"name": "/abs.db"},
        {"name": ".."},
        {"name": ".hidden"},
        {"name": "x\x00y"},
        {"name": "a" * 200},
        {"name": "semi;colon"},
        {"name": ""},
        {"path": "relative.db"},
        {"path": "BACKUPS/../escaped.db"},
        {"path": "BACKUPS/sub/x.db"},
        {"path": "OUTSIDE/outside.db"},
        {"path": "/tmp/../root/appliance-planted.db"},
        {"name": "ok.db", "path": "BACKUPS/ok.db"},
    ],
    ids=lambda b: repr(b)[:40],
)
@pytest.mark.parametrize("via", ["local-socket", "remote-admin"])
def test_backup_outside_the_folder_or_an_unsafe_name_is_refused_and_writes_nothing(
    d: RunningDaemon, remote_admin: httpx.Client, tmp_path: Path, body: dict, via: str
) -> None:
    body = {k: v.replace("BACKUPS", str(backups(d))).replace("OUTSIDE", str(tmp_path)) for k, v in body.items()}
    backups(d).mkdir(exist_ok=True)
    before_data, before_tmp = tree(d.data_dir), tree(tmp_path)
    if via == "local-socket":
        with d.admin() as admin:
            response = admin.post("/admin/ops/backup", json=body)
    else:
        response = remote_admin.post("/admin/ops/backup", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["message"]
    assert tree(d.data_dir) == before_data
    assert tree(tmp_path) == before_tmp
    assert not Path("/root/appliance-planted.db").exists()


def test_backup_never_replaces_an_existing_file(d: RunningDaemon, remote_admin: httpx.Client) -> None:
    folder = backups(d)
    folder.mkdir(exist_ok=True)
    planted = folder / "planted.db"
    planted.write_bytes(b"someone else's file")
    response = remote_admin.post("/admin/ops/backup", json={"name": "planted.db"})
    assert response.status_code == 409, response.text
    assert "already exists" in response.json()["error"]["message"]
    assert planted.read_bytes() == b"someone else's file"

    first = remote_admin.post("/admin/ops/backup", json={"name": "twice.db"})
    assert first.status_code == 200, first.text
    inode = (folder / "twice.db").stat().st_ino
    again = remote_admin.post("/admin/ops/backup", json={"path": str(folder / "twice.db")})
    assert again.status_code == 409, again.text
    assert (folder / "twice.db").stat().st_ino == inode
    assert not [p for p in folder.iterdir() if p.name.startswith(".partial")]


# ---------------------------------------------------------------- hostile restores
def _tamper(good: Path, dest: Path, how: str) -> Path:
    shutil.copyfile(good, dest)
    if how == "not-sqlite":
        dest.write_bytes(b"not a database" * 300)
        return dest
    if how == "corrupt-page":
        conn = sqlite3.connect(dest)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'api_keys'").fetchone()[0]
        conn.close()
        with dest.open("r+b") as f:  # smash the b-tree page header of the api_keys table
            f.seek((root - 1) * page_size)
            f.write(b"\xff" * 12)
        return dest
    conn = sqlite3.connect(dest)
    statements = {
        "trigger": [
            "CREATE TRIGGER keep_keys AFTER UPDATE OF revoked_at ON api_keys "
            "BEGIN UPDATE api_keys SET revoked_at = NULL WHERE id = NEW.id; END"
        ],
        "view": ["CREATE VIEW every_key AS SELECT * FROM api_keys"],
        "extra-table": ["CREATE TABLE stash (payload TEXT)"],
        "extra-index": ["CREATE INDEX ix_sneaky ON api_keys (name)"],
        "virtual-table": ["CREATE VIRTUAL TABLE notes USING fts5(body)"],
        "added-column": ["ALTER TABLE api_keys ADD COLUMN backdoor TEXT"],
        "renamed-column": ["ALTER TABLE api_keys RENAME COLUMN name TO label"],
        "dropped-table": ["DROP TABLE audit_log"],
        "unknown-revision": ["UPDATE alembic_version SET version_num = 'ffff'"],
    }[how]
    for sql in statements:
        conn.execute(sql)
    conn.commit()
    conn.close()
    return dest


HOSTILE = {
    "trigger": "defines triggers",
    "view": "defines views",
    "virtual-table": "virtual tables",
    "extra-table": "unexpected table 'stash'",
    "extra-index": "unexpected index 'ix_sneaky'",
    "added-column": "table 'api_keys' has other columns",
    "renamed-column": "table 'api_keys' has other columns",
    "dropped-table": "missing table 'audit_log'",
    "unknown-revision": "unknown schema revision",
    "corrupt-page": "integrity",
    "not-sqlite": "not an SQLite database",
}


@pytest.mark.parametrize("how", sorted(HOSTILE))
@pytest.mark.parametrize("via", ["local-socket", "remote-admin"])
def test_hostile_restore_is_refused_before_touching_the_live_database(
    d: RunningDaemon, remote_admin: httpx.Client, good_backup: Path, tmp_path: Path, how: str, via: str
) -> None:
    before = d.create_key(f"before-{how}-{via}")
    name = f"hostile-{how}-{via}.db"
    planted = _tamper(good_backup, backups(d) / name, how)
    if via == "local-socket":
        with d.admin() as admin:
            response = admin.post("/admin/ops/restore", json={"path": str(planted)})
    else:
        response = remote_admin.post("/admin/ops/restore", json={"name": name})
    assert 400 <= response.status_code < 500, f"{response.status_code} {response.text}"
    assert HOSTILE[how] in response.json()["error"]["message"], response.text
    # the live database is as it was: the key made just before works, the service is ready
    assert key_works(d, before)
    assert httpx.get(d.url + "/readyz").status_code == 200
    with d.admin() as admin:
        listed = admin.get("/admin/keys/").json()
    assert before[:12] in str(listed)
    # and nothing was planted: a revocation sticks
    with d.admin() as admin:
        admin.delete(f"/admin/keys/{before[:12]}").raise_for_status()
    assert not key_works(d, before)


def test_hostile_restore_leaves_no_private_copy_behind(d: RunningDaemon, good_backup: Path) -> None:
    _tamper(good_backup, backups(d) / "leftover-trigger.db", "trigger")
    with d.admin() as admin:
        assert admin.post("/admin/ops/restore", json={"name": "leftover-trigger.db"}).status_code == 400
    assert not [p for p in d.data_dir.iterdir() if p.name.startswith(".restore-")]


# ---------------------------------------------------------------- where a restore may come from
def test_remote_admin_cannot_restore_from_outside_the_backups_folder(
    d: RunningDaemon, remote_admin: httpx.Client, good_backup: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.db"
    shutil.copyfile(good_backup, outside)
    after = d.create_key("made-after-the-backup")
    for body in (
        {"path": str(outside)},
        {"name": "../" + outside.name},
        {"path": str(backups(d) / ".." / "appliance.db")},
        {"path": "/etc/passwd"},
    ):
        response = remote_admin.post("/admin/ops/restore", json=body)
        assert 400 <= response.status_code < 500, f"{body}: {response.status_code} {response.text}"
    assert key_works(d, after)  # nothing was restored


def test_local_socket_may_restore_a_good_file_from_anywhere(d: RunningDaemon, good_backup: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.db"
    shutil.copyfile(good_backup, outside)
    after = d.create_key("gone-after-local-restore")
    with d.admin() as admin:
        response = admin.post("/admin/ops/restore", json={"path": str(outside)})
    assert response.status_code == 200, response.text
    assert not key_works(d, after)
    assert httpx.get(d.url + "/readyz").status_code == 200


def test_remote_admin_restores_a_good_backup_by_name(d: RunningDaemon, remote_admin: httpx.Client) -> None:
    survivor = d.create_key("survivor")
    with d.admin() as admin:
        made = admin.post("/admin/ops/backup", json={"name": "with-survivor.db"})
        assert made.status_code == 200, made.text
        admin.delete(f"/admin/keys/{survivor[:12]}").raise_for_status()
    assert not key_works(d, survivor)
    # the remote admin key itself was created before this backup, so it still exists afterwards
    response = remote_admin.post("/admin/ops/restore", json={"name": "with-survivor.db"})
    assert response.status_code == 200, response.text
    assert key_works(d, survivor)  # the revocation made after the backup is undone: that is a restore


def test_restore_of_a_missing_name_is_404_and_fifo_is_refused(d: RunningDaemon, remote_admin: httpx.Client) -> None:
    response = remote_admin.post("/admin/ops/restore", json={"name": "no-such-backup.db"})
    assert response.status_code == 404, response.text
    fifo = backups(d) / "pipe.db"
    os.mkfifo(fifo)
    try:
        response = remote_admin.post("/admin/ops/restore", json={"name": "pipe.db"}, timeout=30)
        assert response.status_code == 400 and "not a regular file" in response.text, response.text
    finally:
        fifo.unlink()
