"""The first admin's one-time password file, kept the same way by the installer and by the daemon.

``appliancectl install`` (:mod:`appliance.cli.setup`) and a daemon started on an empty data dir
(:mod:`appliance.cli.first_admin`) both create `admin` with a one-time password and keep it in
``<data dir>/initial-admin-password`` (mode 0600) until the admin has changed it;
``appliancectl users initial-password`` prints it from there.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from sqlalchemy.engine import Engine

from appliance.settings import Settings

INITIAL_PASSWORD_FILE = "initial-admin-password"


def password_file(settings: Settings) -> Path:
    """Where the one-time password is kept: ``<data dir>/initial-admin-password``."""
    return Path(settings.data_dir) / INITIAL_PASSWORD_FILE


def initial_admin_password(settings: Settings, engine: Engine) -> str | None:
    """The first admin's one-time password while it is still the one to sign in with, else None.

    A new password is kept in ``<data dir>/initial-admin-password`` (mode 0600)
    until the admin has changed it, so a later step that fails (the service not
    starting, say) or a re-run still shows it; once it no longer signs in, or
    the admin no longer must change it, the file is removed.
    """
    from sqlalchemy import select
    from sqlmodel import col

    from appliance.accounts.users import ensure_initial_admin, verify_password
    from appliance.db.engine import session
    from appliance.db.tables import User

    path = password_file(settings)
    password = ensure_initial_admin(engine)
    if password is not None:
        try:
            write_private(path, password)
        except OSError:
            click.echo(f"First sign-in: user `admin`, one-time password `{password}` (it could not be saved to {path}).")
            raise
        return password
    if not path.is_file():
        return None
    kept = path.read_text().strip()
    with session(engine) as s:
        admin = s.execute(select(User).where(col(User.username) == "admin")).scalars().first()
        still_valid = admin is not None and admin.must_change_password and verify_password(admin.password_hash, kept)
    if still_valid:
        return kept
    path.unlink(missing_ok=True)
    return None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner may read (0600); an existing file or link there is replaced, not followed."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)
