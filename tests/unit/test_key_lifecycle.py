"""A key's life after creation: rotation with an overlap, expiry changes, what is expiring soon, the expiry alert,
and renaming a team; the pure rules, then the keyring and quota service on a real (migrated) database."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from appliance.accounts.keys import KeyRing
from appliance.accounts.lifecycle import DAY, alert_threshold, check_expiry, expiring_soon, overlap_seconds
from appliance.accounts.rotation import KeyLifecycle
from appliance.db.tables import ApiKey, RetiredSecret
from appliance.errors import AuthenticationFailed, BadRequest, Conflict, NotFound
from appliance.metering.admin import QuotaService
from appliance.metering.alerts import list_alerts
from appliance.metering.key_expiry import KeyExpiryAlerts

NOW = 1_800_000_000.0


# -- the pure rules ------------------------------------------------------------------------------------------------
def test_an_overlap_is_zero_to_seven_days():
    assert overlap_seconds(0) == 0.0
    assert overlap_seconds(168) == 168 * 3600.0
    for bad in (-1, 168.01, float("nan"), float("inf"), True):
        with pytest.raises(BadRequest) as refused:
            overlap_seconds(bad)
        assert refused.value.param == "overlap_hours"


def test_an_expiry_is_cleared_or_in_the_future():
    check_expiry(None, NOW)
    check_expiry(NOW + 1, NOW)
    for bad in (NOW, NOW - 1, float("inf")):
        with pytest.raises(BadRequest, match="expiry"):
            check_expiry(bad, NOW, "expires_at")


def test_the_alert_threshold_is_the_tightest_one_the_key_is_within():
    assert alert_threshold(None, NOW) is None
    assert alert_threshold(NOW + 20 * DAY, NOW) is None
    assert alert_threshold(NOW + 14 * DAY, NOW) == 14
    assert alert_threshold(NOW + 2 * DAY, NOW) == 14
    assert alert_threshold(NOW + 0.5 * DAY, NOW) == 1
    assert alert_threshold(NOW - 1, NOW) is None  # already expired: refused, and the page says so


def _key(id_: int, name: str, expires_at: float | None, revoked_at: float | None = None) -> ApiKey:
    return ApiKey(id=id_, name=name, prefix=f"ak_{name}", secret_hash=f"h{id_}", expires_at=expires_at, revoked_at=revoked_at)


def test_expiring_soon_lists_keys_within_14_days_and_old_secrets_in_overlap_soonest_first():
    keys = [
        _key(1, "soon", NOW + 3 * DAY),
        _key(2, "later", NOW + 30 * DAY),
        _key(3, "never", None),
        _key(4, "gone", NOW + DAY, revoked_at=NOW - 5),
        _key(5, "expired", NOW - DAY),
        _key(6, "sooner", NOW + DAY),
    ]
    rotated = _key(7, "rotated", None)
    retired = [
        (RetiredSecret(key_id=7, prefix="ak_old7", secret_hash="o7", valid_until=NOW + 3600), rotated),
        (RetiredSecret(key_id=7, prefix="ak_older7", secret_hash="o8", valid_until=NOW - 1), rotated),  # overlap over
    ]
    items = expiring_soon(keys, retired, NOW)
    assert [(e.label, e.what) for e in items] == [
        ("rotated (ak_old7…)", "old_secret"),
        ("sooner (ak_sooner…)", "key"),
        ("soon (ak_soon…)", "key"),
    ]
    assert items[2].days_left(NOW) == pytest.approx(3.0)


# -- on a real database ----------------------------------------------------------------------------------------------
def test_a_rotated_key_keeps_its_row_and_both_secrets_work_until_the_overlap_ends(db):
    keyring = KeyRing(db)
    lifecycle = KeyLifecycle(keyring, db)
    row, old_secret = keyring.create("reporting-app", expires_at=time.time() + 30 * DAY)
    assert keyring.authenticate(old_secret).id == row.id
    rotated, new_secret, old = lifecycle.rotate(row.id, 1)
    assert rotated.id == row.id and rotated.name == "reporting-app" and rotated.expires_at == row.expires_at
    assert new_secret != old_secret and rotated.prefix == new_secret[:12] and old.prefix == old_secret[:12]
    assert keyring.authenticate(new_secret).id == row.id
    assert keyring.authenticate(old_secret).id == row.id  # in the overlap (cached principal dropped by the rotation)
    assert keyring.get(old_secret[:12]).id == row.id  # the old prefix still names the key
    assert [(o.prefix, k.id) for o, k in lifecycle.in_overlap()] == [(old.prefix, row.id)]
    with db.begin() as conn:  # the overlap ends
        conn.execute(text("UPDATE retired_key_secrets SET valid_until = :t"), {"t": time.time() - 1})
    keyring.forget_all()
    with pytest.raises(AuthenticationFailed, match="rotated; use the new key") as refused:
        keyring.authenticate(old_secret)
    assert refused.value.code == "rotated_api_key"
    assert keyring.authenticate(new_secret).id == row.id
    assert lifecycle.in_overlap() == []


def test_a_cached_old_secret_is_refused_the_moment_its_overlap_ends(db, monkeypatch):
    keyring = KeyRing(db)
    row, old_secret = keyring.create("cached")
    KeyLifecycle(keyring, db).rotate(row.id, 0.001)  # 3.6 s
    assert keyring.authenticate(old_secret).id == row.id  # now cached
    later = time.time() + 10
    monkeypatch.setattr("appliance.accounts.keys.time.time", lambda: later)
    with pytest.raises(AuthenticationFailed) as refused:
        keyring.remembered(old_secret)
    assert refused.value.code == "rotated_api_key"


def test_overlap_zero_refuses_the_old_secret_at_once_and_revoked_keys_cannot_rotate(db):
    keyring = KeyRing(db)
    lifecycle = KeyLifecycle(keyring, db)
    row, old_secret = keyring.create("now")
    _, new_secret, _ = lifecycle.rotate(row.id, 0)
    with pytest.raises(AuthenticationFailed) as refused:
        keyring.authenticate(old_secret)
    assert refused.value.code == "rotated_api_key"
    keyring.revoke(row.id)
    for secret in (old_secret, new_secret):
        with pytest.raises(AuthenticationFailed, match="Invalid API key"):
            keyring.authenticate(secret)
    with pytest.raises(Conflict, match="revoked key cannot be rotated"):
        lifecycle.rotate(row.id, 1)
    with pytest.raises(BadRequest):
        lifecycle.rotate(keyring.create("other")[0].id, 200)


def test_an_expiry_is_set_and_cleared_and_a_key_set_to_expire_soon_alerts_once(db):
    keyring = KeyRing(db)
    alerts = KeyExpiryAlerts(db)
    lifecycle = KeyLifecycle(keyring, db, after_expiry_change=alerts.raise_due)
    row, secret = keyring.create("billing")
    later = time.time() + 30 * DAY
    assert lifecycle.set_expiry(row.id, later).expires_at == later
    assert list_alerts(db) == []  # 30 days: not within a threshold
    soon = time.time() + 2 * DAY
    lifecycle.set_expiry(row.id, soon)
    assert alerts.raise_due() == []  # raised once, at the change; not again
    (alert,) = list_alerts(db)
    assert (alert.kind, alert.subject, alert.limit) == ("key_expiry", f"billing ({row.prefix}…)", 14.0)
    payload = alert.payload()
    assert payload["type"] == "key.expiry" and payload["expires_at"] == soon and payload["threshold_days"] == 14.0
    with pytest.raises(BadRequest, match="in the future"):
        lifecycle.set_expiry(row.id, time.time() - 5)
    assert lifecycle.set_expiry(row.id, None).expires_at is None
    assert keyring.authenticate(secret).expires_at is None  # the cached principal follows the change
    with db.connect() as conn:
        assert conn.execute(text("SELECT target FROM audit_log WHERE action = 'key.expiry_alert'")).scalars().all() == [
            f"billing ({row.prefix}…)"
        ]


def test_the_last_day_raises_its_own_alert(db):
    keyring = KeyRing(db)
    row, _ = keyring.create("edge", expires_at=time.time() + 2 * DAY)
    clock = [time.time()]
    alerts = KeyExpiryAlerts(db, clock=lambda: clock[0])
    assert len(alerts.raise_due()) == 1  # 14 days
    assert alerts.raise_due() == []
    clock[0] += 1.5 * DAY
    assert len(alerts.raise_due()) == 1  # 1 day
    assert alerts.raise_due() == []
    clock[0] += 1 * DAY  # expired: nothing more
    assert alerts.raise_due() == []
    assert sorted(a.limit for a in list_alerts(db)) == [1.0, 14.0]


def test_a_renamed_team_keeps_its_keys_limits_and_usage(db):
    quotas, keyring = QuotaService(db), KeyRing(db)
    team = quotas.create_team("research", "user:alice")
    quotas.set_quota("team:research", {"tokens_per_day": 1000}, "user:alice")
    row, _ = keyring.create("k", team_id=team["id"])
    renamed = quotas.rename_team("research", "science", "user:alice")
    assert renamed == {"id": team["id"], "name": "science", "created_at": team["created_at"]}
    assert quotas.get_quota("team:science")["limits"]["tokens_per_day"] == 1000
    assert keyring.get(row.id).team_id == team["id"]
    with pytest.raises(NotFound):
        quotas.rename_team("research", "again", "user:alice")
    quotas.create_team("ops", "user:alice")
    with pytest.raises(Conflict, match="already exists") as taken:
        quotas.rename_team("science", "ops", "user:alice")
    assert taken.value.code == "team_exists"
    with pytest.raises(BadRequest):
        quotas.rename_team("science", "no spaces", "user:alice")
    with db.connect() as conn:
        assert conn.execute(text("SELECT actor, target, detail FROM audit_log WHERE action = 'team.rename'")).all() == [
            ("user:alice", "team:science", '{"from": "research", "to": "science"}')
        ]
