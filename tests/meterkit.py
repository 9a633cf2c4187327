"""Helpers for metering tests: a migrated SQLite file, keys, teams, quotas, a clock."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine

from appliance.auth import Principal
from appliance.db import make_engine, migrate, session
from appliance.settings import Settings
from appliance.tables import ApiKey, Price, Quota, Team

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@lru_cache(maxsize=1)
def _template() -> Path:
    path = Path(tempfile.mkdtemp(prefix="meterkit-")) / "template.db"
    migrate(path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def new_db(path: Path) -> Engine:
    """A freshly migrated database file at ``path`` (a copy of one migrated template)."""
    shutil.copyfile(_template(), path)
    return make_engine(path)


def settings(data_dir: Path, **overrides: object) -> Settings:
    return Settings(data_dir=data_dir, seed_default_model=False, **overrides)


def add_team(db: Engine, name: str) -> int:
    with session(db) as s:
        team = Team(name=name)
        s.add(team)
        s.commit()
        return team.id


def add_key(db: Engine, name: str = "k", team_id: int | None = None) -> Principal:
    with session(db) as s:
        key = ApiKey(name=name, prefix=f"ak_{name}"[:12], secret_hash=f"hash-{name}", team_id=team_id)
        s.add(key)
        s.commit()
        return Principal(kind="key", id=key.id, name=key.prefix, role="user", team_id=team_id)


def set_quota(db: Engine, subject_type: str, subject_id: int, **limits: float) -> None:
    with session(db) as s:
        s.add(Quota(subject_type=subject_type, subject_id=subject_id, **limits))
        s.commit()


def set_price(db: Engine, model: str, input_per_m: float = 0.0, output_per_m: float = 0.0, cached_per_m: float = 0.0) -> None:
    with session(db) as s:
        s.merge(Price(model=model, input_per_m=input_per_m, output_per_m=output_per_m, cached_per_m=cached_per_m))
        s.commit()


def rows(db: Engine, sql: str, *args: object) -> list[tuple]:
    conn = sqlite3.connect(db.url.database)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


class Clock:
    """A settable wall clock."""

    def __init__(self, t: float = T0 + 30.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
