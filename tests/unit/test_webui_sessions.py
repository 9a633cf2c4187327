"""Console sessions: random ids, only hashes stored, expiry, revocation; the console secret file."""

from __future__ import annotations

import stat

import pytest
from sqlalchemy import select

from appliance.db.engine import make_engine, migrate, session
from appliance.db.tables import Setting
from appliance.webui.sessions import IDLE_TTL, SESSION_TTL, SessionStore, load_secret


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path):
    migrate(tmp_path / "appliance.db")
    engine = make_engine(tmp_path / "appliance.db")
    yield engine
    engine.dispose()


def test_session_round_trip_and_only_a_hash_is_stored(db):
    store = SessionStore(db)
    sid = store.create(7)
    assert len(sid) >= 40
    assert store.get(sid).user_id == 7
    with session(db) as s:
        rows = list(s.execute(select(Setting)).scalars())
    assert rows and all(sid not in r.key and sid not in r.value for r in rows)
    assert store.get(sid + "x") is None
    assert store.get(None) is None
    assert store.get("y" * 500) is None


def test_sessions_expire_absolutely_and_when_idle(db):
    clock = Clock()
    store = SessionStore(db, clock=clock)
    sid = store.create(1)
    for _ in range(int(SESSION_TTL // (IDLE_TTL / 2))):
        clock.now += IDLE_TTL / 2  # active: keeps the idle timer fresh...
        if store.get(sid) is None:
            break
    assert store.get(sid) is None  # ...but never past the absolute lifetime
    idle = store.create(2)
    clock.now += IDLE_TTL + 1
    assert store.get(idle) is None


def test_delete_and_delete_for_user(db):
    store = SessionStore(db)
    a, b, c = store.create(1), store.create(1), store.create(2)
    store.delete(a)
    assert store.get(a) is None and store.get(b) is not None
    assert store.delete_for_user(1, keep=None) == 1
    assert store.get(b) is None and store.get(c) is not None
    d = store.create(2)
    assert store.delete_for_user(2, keep=d) == 1
    assert store.get(d) is not None and store.get(c) is None


def test_prune_removes_only_dead_sessions(db):
    clock = Clock()
    store = SessionStore(db, clock=clock)
    old = store.create(1)
    clock.now += IDLE_TTL + 1
    fresh = store.create(1)
    assert store.prune() == 1
    assert store.get(fresh) is not None and store.get(old) is None


def test_generated_secret_is_0600_and_stable(tmp_path):
    first = load_secret(None, tmp_path)
    assert len(first) == 32
    assert stat.S_IMODE((tmp_path / "console.secret").stat().st_mode) == 0o600
    assert load_secret(None, tmp_path) == first
    assert load_secret("configured", tmp_path) == b"configured"
