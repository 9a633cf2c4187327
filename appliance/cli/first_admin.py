"""The first admin when the daemon starts on a data dir that has none.

``appliancectl install`` creates the `admin` user before the daemon ever runs;
a daemon started on an empty data dir (``applianced`` alone, a container, a
test box) does the same here, through the installer's own steps: the one-time
password goes to ``<data dir>/initial-admin-password`` (mode 0600) and the log
names that file, never the password. ``appliancectl users initial-password``
prints it while it is still the one to sign in with.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import Engine

from appliance.accounts.users import ensure_initial_admin
from appliance.cli.initial_password import initial_admin_password, password_file, write_private
from appliance.settings import Settings

log = logging.getLogger("appliance.cli.first_admin")
PRINT_COMMAND = "appliancectl users initial-password"


def ensure_first_admin(settings: Settings, engine: Engine) -> Path | None:
    """Create `admin` with a one-time password in the data dir if no admin exists.

    Returns the password file while it holds a password that still signs in, else None.
    A file kept from an earlier run is checked as the installer checks it (and removed
    once the admin has chosen their own password); one the daemon may not read (root's,
    after ``install --system``) is left alone.
    """
    path = password_file(settings)
    password = ensure_initial_admin(engine)
    if password is not None:
        try:
            write_private(path, password)
        except OSError as exc:
            log.error(
                "created the console user `admin`, but its one-time password could not be saved to %s (%s);"
                " set one with `appliancectl users passwd admin`",
                path,
                exc.strerror,
            )
            return None
        log.warning("no admin user existed: created `admin` with a one-time password in %s (`%s` prints it)", path, PRINT_COMMAND)
        return path
    if not path.exists():
        return None
    try:
        pending = initial_admin_password(settings, engine) is not None
    except OSError:  # root's file after a system install: the installer printed it already
        return path
    if pending:
        log.info("the first admin's one-time password is unchanged; it is kept in %s (`%s` prints it)", path, PRINT_COMMAND)
        return path
    return None
