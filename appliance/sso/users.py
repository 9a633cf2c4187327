"""Console users from single sign-on: created at the first sign-in, their role set again at each.

A user from single sign-on is found by the provider's issuer and subject, never
by name alone, so a provider account cannot take over a local account that
happens to share its name: such a sign-in is refused. These users have no
password (the stored hash is not an argon2 hash, so nothing verifies against
it) and the local sign-in refuses them.
"""

from __future__ import annotations

from sqlalchemy import Engine, select
from sqlmodel import col

from appliance.db.engine import session
from appliance.db.tables import User
from appliance.sso.refusals import SignOnForbidden

NO_PASSWORD = "!sso"


def user_from_sign_on(db: Engine, subject: str, username: str, role: str) -> User:
    with session(db) as s:
        row = s.execute(select(User).where(col(User.sso_subject) == subject)).scalars().first()
        named = s.execute(select(User).where(col(User.username) == username)).scalars().first()
        if named is not None and (row is None or named.id != row.id):
            raise SignOnForbidden(
                f"user name {username} taken by another console user",
                f"The console already has another user named {username}. Ask an administrator.",
            )
        if row is None:
            row = User(username=username, password_hash=NO_PASSWORD, role=role, sso_subject=subject)
            s.add(row)
        elif row.disabled:
            raise SignOnForbidden(f"user {row.username} is disabled", "This console user is disabled. Ask an administrator.")
        else:
            row.username = username
            row.role = role
            row.must_change_password = False
        s.commit()
        s.refresh(row)
        return row
