"""Console users: argon2 password hashes, roles, the first-run admin."""

from __future__ import annotations

import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine, select

from appliance.db import session
from appliance.errors import BadRequest, Conflict
from appliance.tables import User

ROLES = ("admin", "operator", "viewer")
_hasher = PasswordHasher()


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(stored_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(stored_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def create_user(db: Engine, username: str, password: str, role: str = "viewer", must_change_password: bool = False) -> User:
    if role not in ROLES:
        raise BadRequest(f"role must be one of {', '.join(ROLES)}", param="role")
    if not username or len(username) > 64 or not username.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise BadRequest("user names are 1-64 letters, digits, '.', '-' and '_'", param="username")
    if len(password) < 8:
        raise BadRequest("passwords need at least 8 characters", param="password")
    with session(db) as s:
        if s.execute(select(User).where(User.username == username)).scalars().first():
            raise Conflict(f"user {username} already exists")
        user = User(username=username, password_hash=hash_password(password), role=role, must_change_password=must_change_password)
        s.add(user)
        s.commit()
        s.refresh(user)
        return user


def ensure_initial_admin(db: Engine) -> str | None:
    """Create the `admin` user with a one-time password if no admin exists; return that password."""
    with session(db) as s:
        if s.execute(select(User).where(User.role == "admin")).scalars().first():
            return None
    password = secrets.token_urlsafe(12)
    create_user(db, "admin", password, role="admin", must_change_password=True)
    return password
