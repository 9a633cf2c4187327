"""/admin/cache (stats, purge, policy) in-process, and `appliancectl cache` against it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from appliance.accounts.keys import KeyRing
from appliance.api.cache import CacheController
from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.cli.client import check
from appliance.db.audit import AuditTrail
from appliance.db.engine import make_engine
from appliance.errors import ModelNotFound
from appliance.serving.names import ModelNames
from tests.appkit import local_admin_app
from tests.cachekit import MODEL, chat, chat_result, make_cache, principal


class RecordingAudit(AuditTrail):
    """The real audit trail, also keeping each row's arguments for the assertions."""

    def __init__(self, db, rows):
        super().__init__(db)
        self.rows = rows

    def record(self, *args):
        super().record(*args)
        self.rows.append(args)


@pytest.fixture
def env(tmp_path):
    cache = make_cache(tmp_path)
    db = make_engine(cache.settings.db_path)
    keyring = KeyRing(db)
    audits = []
    installed = {"tiny": SimpleNamespace(name=MODEL)}

    def resolve(name):
        if name not in installed:
            raise ModelNotFound(f"The model `{name}` does not exist.")
        return installed[name]

    names = ModelNames(cache.settings, db, SimpleNamespace(resolve=resolve))
    services = SimpleNamespace(cache=cache, keyring=keyring, db=db, names=names, audit=RecordingAudit(db, audits))
    app = local_admin_app([CacheController], services, exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(app) as client:
        yield SimpleNamespace(client=client, cache=cache, keyring=keyring, audits=audits)
    cache.close()


def fill(cache, *who):
    for p in who:
        cache.store(p, "chat", MODEL, chat(), chat_result(), {})
    cache.flush()


def test_stats(env):
    fill(env.cache, principal(1))
    env.cache.lookup(principal(1), "chat", MODEL, chat(), {})
    s = env.client.get("/admin/cache/stats").json()
    assert s["entries"] == 1 and s["hits_by_tier"]["exact"] == 1 and s["hit_rate"] == 1.0


def test_purge_needs_a_target_and_resolves_names(env):
    row, _ = env.keyring.create("alice")
    fill(env.cache, principal(row.id), principal(999))
    assert env.client.post("/admin/cache/purge", json={}).status_code == 400
    assert env.client.post("/admin/cache/purge", json={"all": True, "model": "tiny"}).status_code == 400
    r = env.client.post("/admin/cache/purge", json={"key": row.prefix})
    assert r.status_code == 200 and r.json()["purged"] == 1 and r.json()["key_id"] == row.id
    assert env.client.post("/admin/cache/purge", json={"key": "ak_nosuchkey"}).status_code == 404
    assert env.client.post("/admin/cache/purge", json={"model": "tiny"}).json() == {"purged": 1, "model": MODEL, "key_id": None}
    fill(env.cache, principal(5))
    assert env.client.post("/admin/cache/purge", json={"all": True}).json()["purged"] == 1
    assert [a[1] for a in env.audits] == ["cache.purge"] * 3


def test_policies_of_key_team_and_global(env):
    row, _ = env.keyring.create("bob")
    assert (
        env.client.put("/admin/cache/policy", json={"scope": "key", "id": row.prefix, "policy": {"bogus": 1}}).status_code == 400
    )
    r = env.client.put(
        "/admin/cache/policy", json={"scope": "key", "id": str(row.id), "policy": {"cache_nondeterministic": True}}
    )
    assert r.status_code == 200, r.text
    assert env.client.get("/admin/cache/policy", params={"scope": "key", "id": row.prefix}).json()["policy"] == {
        "cache_nondeterministic": True
    }
    assert env.keyring.get(row.id).cache_policy == json.dumps({"cache_nondeterministic": True})
    # teams must exist
    assert (
        env.client.put("/admin/cache/policy", json={"scope": "team", "id": "42", "policy": {"enabled": False}}).status_code == 404
    )
    r = env.client.put("/admin/cache/policy", json={"scope": "global", "policy": {"semantic": False}})
    assert r.json() == {"scope": "global", "id": None, "policy": {"semantic": False}}
    got = env.client.get("/admin/cache/policy").json()
    assert got["policy"] == {"semantic": False} and got["defaults"]["semantic_threshold"] == 0.95
    env.client.put("/admin/cache/policy", json={"scope": "global", "policy": None})
    assert env.client.get("/admin/cache/policy").json()["policy"] is None


def test_cli_stats_and_purge(env, monkeypatch):
    from appliance.cli import cli

    def through_app(ctx, method, path, **kwargs):
        return check(env.client.request(method, path, **kwargs))

    monkeypatch.setattr("appliance.cli.cache.request", through_app)
    fill(env.cache, principal(1), principal(2))
    runner = CliRunner()
    out = runner.invoke(cli, ["cache", "stats"])
    assert out.exit_code == 0, out.output
    assert "entries" in out.output and "2 of 100000" in out.output
    out = runner.invoke(cli, ["cache", "stats", "--json"])
    assert json.loads(out.output)["entries"] == 2
    assert runner.invoke(cli, ["cache", "purge"]).exit_code == 2
    out = runner.invoke(cli, ["cache", "purge", "--all"])
    assert out.exit_code == 0 and "Purged 2 cached responses." in out.output
    out = runner.invoke(cli, ["cache", "policy", "global", "--set", '{"enabled": false}'])
    assert out.exit_code == 0 and json.loads(out.output)["policy"] == {"enabled": False}
    out = runner.invoke(cli, ["cache", "policy", "global", "--set", '{"share": "world"}'])
    assert out.exit_code != 0 and "share must be one of" in out.output
