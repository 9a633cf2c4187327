"""Helpers for metering tests: a migrated SQLite file, keys, teams, quotas, a clock."""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import sqlite3
import tempfile
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine

from appliance.accounts.keys import Principal
from appliance.db.engine import make_engine, migrate, session
from appliance.db.tables import ApiKey, Price, Quota, Team
from appliance.settings import Settings

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


def sqlite_memory_used() -> int:
    """Bytes SQLite holds in this process now (every connection's page cache, statements, sorters)."""
    lib = ctypes.CDLL("libsqlite3.so.0")  # the library Python's sqlite3 module runs on
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


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


# -- workers run in other processes (spawned: they must be importable) ----------------------
def admit_in_threads(db_path: str, principal: Principal, count: int, tag: str, barrier, results) -> None:
    """``count`` threads, each with its own Meter (own connection), admit at once; admitted ones settle."""
    import asyncio
    import threading

    from appliance.errors import RateLimited
    from appliance.metering.meter import Meter

    engine = make_engine(Path(db_path))
    meters = [Meter(settings(Path(db_path).parent), engine) for _ in range(count)]
    admitted = []

    def one(i: int) -> None:
        barrier.wait()
        with contextlib.suppress(RateLimited):
            admitted.append(
                (
                    meters[i],
                    meters[i].admit_now(principal, request_id=f"{tag}-{i}", endpoint="chat", model="m", estimated_tokens=100),
                )
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for meter, admission in admitted:
        asyncio.run(
            meter.settle(
                admission,
                model="m",
                variant=None,
                backend="x",
                prompt_tokens=40,
                completion_tokens=60,
                cached_tokens=0,
                ttft_ms=1.0,
                latency_ms=2.0,
                status=200,
            )
        )
    for meter in meters:
        meter.close()
    results.put(len(admitted))


def hammer(db_path: str, key_id: int, tasks: int = 32) -> None:
    """Admit and settle as fast as possible; print each request id once its settle has returned."""
    import asyncio
    import sys

    from appliance.metering.meter import Meter

    async def main() -> None:
        engine = make_engine(Path(db_path))
        meter = Meter(settings(Path(db_path).parent), engine)
        await meter.start(release_reservations=False)
        principal = Principal(kind="key", id=key_id, name="ak_hammer", role="user")
        counter = iter(range(10**9))

        async def worker() -> None:
            while True:
                rid = f"h{next(counter)}"
                admission = await meter.admit(principal, request_id=rid, endpoint="chat", model="m", estimated_tokens=50)
                await meter.settle(
                    admission,
                    model="m",
                    variant=None,
                    backend="x",
                    prompt_tokens=20,
                    completion_tokens=30,
                    cached_tokens=0,
                    ttft_ms=1.0,
                    latency_ms=2.0,
                    status=200,
                )
                sys.stdout.write(rid + "\n")
                sys.stdout.flush()

        await asyncio.gather(*(worker() for _ in range(tasks)))

    asyncio.run(main())
