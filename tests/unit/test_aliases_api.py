"""``/admin/aliases`` in-process over a real store: set (target resolved), refused names, unknown targets, delete, audit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from litestar.testing import TestClient
from sqlmodel import select

from appliance.api.admin import AliasesController
from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import AuditLog
from appliance.serving.names import ModelNames
from tests.appkit import local_admin_app
from tests.ggufkit import make_tiny_gguf
from tests.storekit import make_store


@pytest.fixture()
def setup(tmp_path: Path) -> Iterator[tuple[TestClient, ModelNames, object]]:
    store = make_store(tmp_path / "data")
    store.import_path(str(make_tiny_gguf(tmp_path / "tiny.gguf")), name="tiny:f32")
    names = ModelNames(store.settings, store.db, store)
    services = SimpleNamespace(names=names, store=store, db=store.db, audit=AuditTrail(store.db))
    with TestClient(local_admin_app([AliasesController], services, exception_handlers=EXCEPTION_HANDLERS)) as client:
        yield client, names, store.db


def test_an_alias_names_the_canonical_target_and_is_resolved_at_once(setup):
    client, names, db = setup
    assert names.resolve("tiny").name == "tiny:f32"  # remembered before the alias exists
    r = client.put("/admin/aliases/bot", json={"target": "tiny"})
    assert r.status_code == 200 and r.json() == {"name": "bot", "target": "tiny:f32"}
    assert client.get("/admin/aliases").json() == {"default": names.aliases()["default"], "bot": "tiny:f32"}
    assert names.resolve("bot").name == "tiny:f32"
    assert client.delete("/admin/aliases/bot").status_code == 200
    assert "bot" not in client.get("/admin/aliases").json()
    with session(db) as s:
        actions = [(a.action, a.target, a.detail) for a in s.execute(select(AuditLog).order_by(AuditLog.id)).scalars()]
    assert ("alias.set", "bot", "tiny:f32") in actions and ("alias.delete", "bot", None) in actions


@pytest.mark.parametrize("name", ["default", "with space", "a" * 65, "dots.not.allowed", "ünïcode"])
def test_refused_alias_names_are_400_naming_name(setup, name):
    client, _names, _db = setup
    r = client.put(f"/admin/aliases/{name}", json={"target": "tiny:f32"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text


def test_an_alias_to_a_model_not_installed_is_404(setup):
    client, _names, _db = setup
    r = client.put("/admin/aliases/bot", json={"target": "nope:q4"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert "bot" not in client.get("/admin/aliases").json()
