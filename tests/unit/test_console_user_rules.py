"""The rules that keep the console administrable: nobody changes, disables or deletes themselves, and the
last active admin can be neither demoted, disabled nor deleted, even when two admins act at the same moment."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from appliance.accounts import user_admin
from appliance.accounts.users import ROLES, create_user
from appliance.db.engine import session
from appliance.db.tables import User
from appliance.errors import Conflict, NotFound


def _user(db, name: str, role: str) -> int:
    return create_user(db, name, f"{name}-password-1", role=role).id  # type: ignore[return-value]


def _roles(db) -> dict[str, tuple[str, bool]]:
    with session(db) as s:
        return {u.username: (u.role, u.disabled) for u in s.execute(select(User)).scalars()}


def test_nobody_changes_disables_or_deletes_themselves(db):
    alice = _user(db, "alice", "admin")
    _user(db, "bob", "admin")
    for act in (
        lambda: user_admin.set_role(db, alice, alice, "viewer", ROLES),
        lambda: user_admin.set_disabled(db, alice, alice, True),
        lambda: user_admin.delete_user(db, alice, alice),
        lambda: user_admin.reset_password(db, alice, alice, "x"),
    ):
        with pytest.raises(Conflict, match="yourself") as refused:
            act()
        assert refused.value.code == "self_change"
    assert _roles(db)["alice"] == ("admin", False)


def test_the_last_active_admin_cannot_be_demoted_disabled_or_deleted(db):
    alice, bob = _user(db, "alice", "admin"), _user(db, "bob", "admin")
    carol = _user(db, "carol", "operator")
    user_admin.set_disabled(db, alice, bob, True)  # bob is an admin, but a disabled one
    # the acting user is not an admin any more (a stale page): alice is the last active admin
    for act, word in (
        (lambda: user_admin.set_role(db, carol, alice, "viewer", ROLES), "demoted"),
        (lambda: user_admin.set_disabled(db, carol, alice, True), "disabled"),
        (lambda: user_admin.delete_user(db, carol, alice), "deleted"),
    ):
        with pytest.raises(Conflict, match=f"last active admin and cannot be {word}") as refused:
            act()
        assert refused.value.code == "last_admin"
    assert _roles(db)["alice"] == ("admin", False)
    # a disabled admin is not the last one, and goes; promoting never needs another admin
    assert user_admin.delete_user(db, alice, bob).username == "bob"
    user_admin.set_role(db, alice, carol, "admin", ROLES)
    user_admin.set_role(db, carol, alice, "viewer", ROLES)  # now carol remains
    assert _roles(db) == {"alice": ("viewer", False), "carol": ("admin", False)}


def test_two_admins_deleting_each_other_at_once_leave_one(db):
    for _round in range(10):
        a, b = _user(db, f"a{_round}", "admin"), _user(db, f"b{_round}", "admin")
        with session(db) as s:  # only these two are admins in this round
            for u in s.execute(select(User)).scalars():
                if u.id not in (a, b):
                    u.role = "viewer"
            s.commit()
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def remove(actor: int, target: int, barrier: threading.Barrier = barrier, outcomes: list[str] = outcomes) -> None:
            barrier.wait()
            try:
                user_admin.delete_user(db, actor, target)
                outcomes.append("deleted")
            except Conflict as exc:
                outcomes.append(exc.code or "")

        threads = [threading.Thread(target=remove, args=(a, b)), threading.Thread(target=remove, args=(b, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["deleted", "last_admin"]
        assert sum(1 for role, disabled in _roles(db).values() if role == "admin" and not disabled) == 1


def test_unknown_users_and_roles(db):
    alice = _user(db, "alice", "admin")
    with pytest.raises(NotFound):
        user_admin.delete_user(db, alice, 999)
    with pytest.raises(Exception, match="role must be one of"):
        user_admin.set_role(db, alice, 999, "root", ROLES)
