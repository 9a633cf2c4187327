"""Changing and deleting console users, with the two rules that keep the console administrable.

- Nobody changes their own role, disables or deletes themselves: another admin must.
- The last active admin can be neither demoted, disabled nor deleted. The check and the
  write are one SQL statement, so two admins removing each other at the same moment
  cannot both succeed: SQLite runs the statements one after the other, and the second
  finds no other active admin.

Each function returns the row as it was before the change (for the audit line) and
raises ``Conflict`` with a message for people, or ``NotFound`` for an unknown user.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from appliance.db.engine import session
from appliance.db.tables import User
from appliance.errors import BadRequest, Conflict, NotFound

ADMIN = "admin"

# True when the user :id is not an active admin, or another active admin remains.
_OTHER_ADMIN_REMAINS = (
    "(role != 'admin' OR disabled"
    " OR EXISTS (SELECT 1 FROM users AS other WHERE other.role = 'admin' AND NOT other.disabled AND other.id != :id))"
)


def _target(db: Engine, user_id: int) -> User:
    with session(db) as s:
        row = s.get(User, user_id)
        if row is None:
            raise NotFound("No such user.", param="user")
        s.expunge(row)
        return row


def _refuse_self(actor_id: int, user_id: int, what: str) -> None:
    if actor_id == user_id:
        raise Conflict(f"You cannot {what} yourself; ask another admin.", code="self_change")


def _last_admin(row: User, what: str) -> Conflict:
    return Conflict(
        f"{row.username} is the last active admin and cannot be {what}; make another user an admin first.", code="last_admin"
    )


def _guarded_write(db: Engine, sql: str, params: dict[str, object]) -> bool:
    """Run the guarded statement; False when its guard held it back. NotFound if the user went meanwhile."""
    with session(db) as s:
        count = s.execute(text(sql), params).rowcount  # type: ignore[attr-defined]
        s.commit()
    if count:
        return True
    _target(db, int(params["id"]))  # type: ignore[call-overload]
    return False


def set_role(db: Engine, actor_id: int, user_id: int, role: str, roles: tuple[str, ...]) -> User:
    """Give ``user_id`` the role ``role``; refused for oneself and for demoting the last active admin."""
    if role not in roles:
        raise BadRequest(f"role must be one of {', '.join(roles)}", param="role")
    _refuse_self(actor_id, user_id, "change the role of")
    row = _target(db, user_id)
    guard = "" if role == ADMIN else f" AND {_OTHER_ADMIN_REMAINS}"
    if not _guarded_write(db, f"UPDATE users SET role = :role WHERE id = :id{guard}", {"id": user_id, "role": role}):
        raise _last_admin(row, "demoted")
    return row


def set_disabled(db: Engine, actor_id: int, user_id: int, disabled: bool) -> User:
    """Disable or enable ``user_id``; refused for oneself and for disabling the last active admin."""
    _refuse_self(actor_id, user_id, "disable" if disabled else "enable")
    row = _target(db, user_id)
    guard = f" AND {_OTHER_ADMIN_REMAINS}" if disabled else ""
    if not _guarded_write(
        db, f"UPDATE users SET disabled = :disabled WHERE id = :id{guard}", {"id": user_id, "disabled": disabled}
    ):
        raise _last_admin(row, "disabled")
    return row


def delete_user(db: Engine, actor_id: int, user_id: int) -> User:
    """Delete ``user_id``; refused for oneself and for the last active admin. Their audit rows stay (they name
    the user by name); ending their sessions is the caller's part."""
    _refuse_self(actor_id, user_id, "delete")
    row = _target(db, user_id)
    if not _guarded_write(db, f"DELETE FROM users WHERE id = :id AND {_OTHER_ADMIN_REMAINS}", {"id": user_id}):
        raise _last_admin(row, "deleted")
    return row


def reset_password(db: Engine, actor_id: int, user_id: int, password_hash: str) -> User:
    """Give ``user_id`` a new password hash that must be changed at the next sign-in (one's own goes through
    the password page instead)."""
    _refuse_self(actor_id, user_id, "reset the password of")
    row = _target(db, user_id)
    if row.sso_subject is not None:
        raise BadRequest(f"{row.username} signs in through the identity provider and has no password here.", param="user")
    _guarded_write(
        db,
        "UPDATE users SET password_hash = :hash, must_change_password = 1 WHERE id = :id",
        {"id": user_id, "hash": password_hash},
    )
    return row
