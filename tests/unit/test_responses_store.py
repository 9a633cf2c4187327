"""Stored responses on a real migrated SQLite file: owner only, expiry, purge."""

import time

import pytest

from appliance.accounts.keys import LOCAL_ADMIN
from appliance.errors import NotFound
from appliance.serving.responses.stored import ResponseStore
from tests.meterkit import add_key, new_db, settings

ITEMS = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def _response(response_id: str) -> dict:
    return {
        "id": response_id,
        "object": "response",
        "model": "m",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}],
            }
        ],
    }


def test_only_the_creating_key_reads_continues_or_deletes(tmp_path):
    db = new_db(tmp_path / "a.db")
    store = ResponseStore(settings(tmp_path), db)
    owner, other = add_key(db, "owner"), add_key(db, "other")
    store.save(owner, ITEMS, _response("resp_a"))
    conversation = store.load(owner, "resp_a")
    assert conversation.continued() == ITEMS + _response("resp_a")["output"]
    for principal in (other, LOCAL_ADMIN):
        with pytest.raises(NotFound):
            store.load(principal, "resp_a")
        with pytest.raises(NotFound):
            store.delete(principal, "resp_a")
    store.delete(owner, "resp_a")
    with pytest.raises(NotFound):
        store.load(owner, "resp_a")


def test_the_admin_socket_owns_what_it_stored(tmp_path):
    db = new_db(tmp_path / "b.db")
    store = ResponseStore(settings(tmp_path), db)
    store.save(LOCAL_ADMIN, ITEMS, _response("resp_local"))
    assert store.load(LOCAL_ADMIN, "resp_local").response["id"] == "resp_local"
    with pytest.raises(NotFound):
        store.load(add_key(db, "k"), "resp_local")


def test_expired_responses_are_not_found_and_purged(tmp_path):
    db = new_db(tmp_path / "c.db")
    short = ResponseStore(settings(tmp_path, responses_ttl_hours=0.0001), db)  # 0.36 s
    keeper = ResponseStore(settings(tmp_path), db)
    owner = add_key(db, "owner")
    short.save(owner, ITEMS, _response("resp_old"))
    keeper.save(owner, ITEMS, _response("resp_new"))
    assert short.load(owner, "resp_old").items == ITEMS
    time.sleep(0.5)
    with pytest.raises(NotFound) as info:
        short.load(owner, "resp_old")
    assert info.value.param == "previous_response_id" and info.value.status == 404
    assert keeper.purge_expired() == 1
    assert keeper.load(owner, "resp_new").response["id"] == "resp_new"
    assert keeper.purge_expired() == 0
