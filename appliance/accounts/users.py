"""Console users: argon2 password hashes, roles, the first-run admin."""

from __future__ import annotations

import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine, select
from sqlmodel import col

from appliance.accounts.common_passwords import COMMON_PASSWORDS
from appliance.db.engine import session
from appliance.db.tables import User
from appliance.errors import BadRequest, Conflict, NotFound

ROLES = ("admin", "operator", "viewer")
MIN_PASSWORD = 12
_hasher = PasswordHasher()

# Keyboard rows, columns and sequences, forwards; walks are looked up in these and their reverses.
_WALKS: tuple[str, ...] = (
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
    "azertyuiop",
    "qwertzuiop",
    "1234567890",
    "abcdefghijklmnopqrstuvwxyz",
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p",
    "qazwsxedcrfvtgbyhnujmikolp",
    "!@#$%^&*()",
)
_WALKS = _WALKS + tuple(w[::-1] for w in _WALKS)
_LEET = str.maketrans({"@": "a", "4": "a", "0": "o", "1": "i", "!": "i", "3": "e", "$": "s", "5": "s", "7": "t", "+": "t"})
_EDGE = "0123456789!@#$%^&*()-_=+.,;:?~ "


def _walk_share(text: str) -> float:
    """The share of characters that lie in runs of 3+ consecutive keyboard or alphabet neighbours."""
    covered = [False] * len(text)
    i = 0
    while i < len(text) - 2:
        best = 0
        for walk in _WALKS:
            at = walk.find(text[i : i + 3])
            if at < 0:
                continue
            n = 3
            while i + n < len(text) and at + n < len(walk) and walk[at + n] == text[i + n]:
                n += 1
            best = max(best, n)
        if best:
            for j in range(i, i + best):
                covered[j] = True
            i += best
        else:
            i += 1
    return sum(covered) / len(text)


def password_problem(password: str, username: str | None = None) -> str | None:
    """Why ``password`` is too weak for a console user, or None if it is acceptable.

    At least ``MIN_PASSWORD`` characters; not a common password (also after
    stripping digits and symbols from the ends and undoing letter swaps such as
    ``@`` for ``a``); not the user name; not one character or a short group repeated,
    nor digits only; not a keyboard walk or sequence (``qwertyuiop``, ``1qaz2wsx``, ``abcdef…``).
    """
    if len(password) < MIN_PASSWORD:
        return f"Choose a password of at least {MIN_PASSWORD} characters."
    lowered = password.lower()
    core = lowered.strip(_EDGE)
    candidates = {lowered, core, lowered.translate(_LEET), core.translate(_LEET), lowered.translate(_LEET).strip(_EDGE)}
    if candidates & COMMON_PASSWORDS or any(c.rstrip("0123456789") in COMMON_PASSWORDS for c in candidates if c):
        return "That password is one of the most commonly used passwords; choose another."
    name = (username or "").strip().lower()
    if name and (
        name in candidates
        or name[::-1] in candidates
        or (len(name) >= 3 and name in core and core.replace(name, "").strip(_EDGE) == "")
    ):
        return "The password must not be the user name."
    if lowered.isdigit():
        return "The password must not be digits only."
    for size in range(1, len(lowered) // 2 + 1):
        if len(lowered) % size == 0 and lowered[:size] * (len(lowered) // size) == lowered:
            return "The password must not be one character or a short group repeated."
    if len(set(lowered)) < 5:
        return "The password must use at least five different characters."
    if _walk_share(lowered) >= 0.75:
        return "The password must not be a keyboard walk or a sequence such as qwertyuiop or abcdef."
    return None


def check_password(password: str, username: str | None = None) -> None:
    """Raise BadRequest (param ``password``) with the reason if the password is too weak."""
    problem = password_problem(password, username)
    if problem is not None:
        raise BadRequest(problem, param="password")


def generate_password(username: str | None = None) -> str:
    """A random one-time password that passes the policy."""
    while True:
        password = secrets.token_urlsafe(12)  # 16 characters
        if password_problem(password, username) is None:
            return password


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
    check_password(password, username)
    with session(db) as s:
        if s.execute(select(User).where(col(User.username) == username)).scalars().first():
            raise Conflict(f"user {username} already exists")
        user = User(
            username=username, password_hash=hash_password(password), role=role, must_change_password=must_change_password
        )
        s.add(user)
        s.commit()
        s.refresh(user)
        return user


def ensure_initial_admin(db: Engine) -> str | None:
    """Create the `admin` user with a one-time password if no admin exists; return that password."""
    with session(db) as s:
        if s.execute(select(User).where(col(User.role) == "admin")).scalars().first():
            return None
    password = generate_password("admin")
    create_user(db, "admin", password, role="admin", must_change_password=True)
    return password


def set_password(db: Engine, username: str, password: str, must_change_password: bool = False) -> User:
    """Set a user's password (policy-checked); ``NotFound`` if there is no such user."""
    check_password(password, username)
    with session(db) as s:
        user = s.execute(select(User).where(col(User.username) == username)).scalars().first()
        if user is None:
            raise NotFound(f"no console user {username}")
        user.password_hash = hash_password(password)
        user.must_change_password = must_change_password
        s.commit()
        s.refresh(user)
        return user
