"""Deleting a team: refused while it has live keys; otherwise it leaves the lists, its limits go, an audit row
says so, and its row stays (name reserved) so usage rows and revoked keys still name it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from appliance.accounts.keys import KeyRing
from appliance.errors import BadRequest, Conflict, NotFound
from appliance.metering.admin import QuotaService


def test_a_team_with_live_keys_is_refused_until_they_are_revoked(db):
    quotas, keyring = QuotaService(db), KeyRing(db)
    team = quotas.create_team("research", "user:alice")
    quotas.set_quota("team:research", {"tokens_per_day": 1000}, "user:alice")
    keys = [keyring.create(f"k{i}", team_id=team["id"])[0] for i in range(2)]
    with pytest.raises(Conflict, match="still has 2 active keys; revoke them or move them") as refused:
        quotas.delete_team("research", "user:alice")
    assert refused.value.code == "team_has_keys"
    assert [t["name"] for t in quotas.list_teams()] == ["research"]
    for key in keys:
        keyring.revoke(key.id)
    gone = quotas.delete_team("research", "user:alice")
    assert gone["name"] == "research" and gone["deleted_at"]
    assert quotas.list_teams() == []
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM quotas WHERE subject_type = 'team'")).scalar_one() == 0
        assert conn.execute(text("SELECT actor, target FROM audit_log WHERE action = 'team.delete'")).all() == [
            ("user:alice", "team:research")
        ]
        # revoked keys keep naming the team: the row is still there
        assert conn.execute(text("SELECT count(*) FROM api_keys k JOIN teams t ON t.id = k.team_id")).scalar_one() == 2
    with pytest.raises(NotFound):
        quotas.delete_team("research", "user:alice")


def test_a_deleted_team_takes_no_keys_and_keeps_its_name(db):
    quotas, keyring = QuotaService(db), KeyRing(db)
    team = quotas.create_team("ops", "user:alice")
    quotas.delete_team("ops", "user:alice")
    with pytest.raises(BadRequest, match="listed teams"):
        keyring.create("late", team_id=team["id"])
    key, _secret = keyring.create("other")
    with pytest.raises(BadRequest, match="listed teams"):
        keyring.update(key.id, team_id=team["id"])
    with pytest.raises(Conflict, match="name stays reserved"):
        quotas.create_team("ops", "user:alice")
