"""Fixtures shared by the unit tests of the meter (quotas, budget alerts): a migrated SQLite file, a
settable clock, and a started meter over both. A module that defines a fixture of the same name keeps its own."""

from __future__ import annotations

import pytest

from appliance.metering.meter import Meter
from tests.meterkit import Clock, new_db, settings


@pytest.fixture
def db(tmp_path):
    engine = new_db(tmp_path / "a.db")
    yield engine
    engine.dispose()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
async def meter(tmp_path, db, clock):
    m = Meter(settings(tmp_path), db, clock=clock)
    await m.start()
    yield m
    await m.stop()
    m.close()
