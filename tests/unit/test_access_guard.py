"""The access guard on the event loop: a key it remembers costs no thread and no query; a new one is looked up off it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from litestar.datastructures import Headers

from appliance.accounts.keys import KeyRing
from appliance.api.access import PRINCIPAL, Access, AccessGuard, requires
from appliance.errors import AuthenticationFailed
from tests.meterkit import new_db

KEYED = SimpleNamespace(opt=requires(Access.KEY))


def connection(token: str) -> SimpleNamespace:
    return SimpleNamespace(scope={}, headers=Headers({"authorization": f"Bearer {token}"}))


async def test_a_remembered_key_is_checked_on_the_loop_and_an_unseen_one_on_a_thread(tmp_path, monkeypatch):
    db = new_db(tmp_path / "a.db")
    ring = KeyRing(db)
    _, token = ring.create("app")
    guard = AccessGuard(lambda: ring)
    hops = []
    real = asyncio.to_thread

    async def counted(fn, *args):
        hops.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    first = connection(token)
    await guard(first, KEYED)
    assert hops == ["authenticate"]  # not seen yet: the database, off the loop
    assert first.scope[PRINCIPAL].kind == "key"
    for _ in range(3):
        again = connection(token)
        await guard(again, KEYED)
        assert again.scope[PRINCIPAL] == first.scope[PRINCIPAL]
    assert hops == ["authenticate"]  # remembered: no thread, no query
    ring.revoke(first.scope[PRINCIPAL].id)
    with pytest.raises(AuthenticationFailed):
        await guard(connection(token), KEYED)  # the very next request after the revocation
    with pytest.raises(AuthenticationFailed):
        await guard(connection("not-a-key"), KEYED)  # malformed: refused before any look-up
    assert hops == ["authenticate", "authenticate"]
    db.dispose()
