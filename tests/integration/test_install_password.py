"""The first admin's one-time password survives until it is changed.

`appliancectl install` (local mode here; system mode runs the same
``prepare_data``) keeps a new admin password in ``<data dir>/initial-admin-password``
(mode 0600) and shows it on every re-run while the admin must still change it;
once the password has been changed the file is removed and the re-run says so.
"""

import re
import stat
import subprocess
import sys

import pytest
from sqlalchemy import select

from appliance.accounts.users import set_password, verify_password
from appliance.db import engine as dbmod
from appliance.db.tables import User
from tests.daemon import daemon_env, free_port

pytestmark = pytest.mark.slow
SHOWN = re.compile(r"one-time password `([^`]+)`")


def _install(data_dir, port):
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "install", "--local", "--no-serve"],
        env=daemon_env(data_dir, port),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _admin(engine):
    with dbmod.session(engine) as s:
        return s.execute(select(User).where(User.username == "admin")).scalars().one()


def test_one_time_password_is_kept_and_shown_again_until_changed(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    saved = data_dir / "initial-admin-password"

    first = _install(data_dir, port)
    shown = SHOWN.search(first)
    assert shown, first
    password = shown.group(1)
    assert saved.read_text().strip() == password
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    engine = dbmod.make_engine(data_dir / "appliance.db")
    try:
        admin = _admin(engine)
        assert admin.must_change_password and verify_password(admin.password_hash, password)

        again = _install(data_dir, port)  # a re-run (after a failed service start, say) shows the same password
        assert SHOWN.search(again) and SHOWN.search(again).group(1) == password, again
        assert "already exists" not in again
        assert saved.read_text().strip() == password

        set_password(engine, "admin", "Quiet-harbour-lantern-92")  # the admin changes it
        after = _install(data_dir, port)
        assert SHOWN.search(after) is None, after
        assert password not in after
        assert "An admin user already exists; its password was kept." in after
        assert not saved.exists()
    finally:
        engine.dispose()
