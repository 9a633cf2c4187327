"""The batch store on a real, migrated SQLite database: what a crash leaves pending, and who sees what."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from appliance.accounts.keys import LOCAL_ADMIN, Principal
from appliance.batch.files import FileStore
from appliance.batch.store import BatchStore, LineResult
from appliance.db.engine import make_engine, migrate, session
from appliance.errors import BadRequest, Conflict, NotFound
from appliance.settings import Settings

LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",'
    b' "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'
)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "appliance.db"
    migrate(path)
    engine = make_engine(path)
    yield engine
    engine.dispose()


def _key(key_id: int, role: str = "user") -> Principal:
    return Principal(kind="key", id=key_id, name=f"ak_{key_id}", role=role)


def _usage(db, request_id: str) -> None:
    with session(db) as s:
        s.execute(
            text(
                "INSERT INTO usage (request_id, created_at, endpoint, model, prompt_tokens, completion_tokens, cached_tokens,"
                " status, cache_tier, cost) VALUES (:r, :t, 'chat', 'm', 3, 4, 0, 200, 'miss', 0)"
            ),
            {"r": request_id, "t": time.time()},
        )
        s.commit()


def test_recover_keeps_what_the_ledger_charged_and_drops_the_rest(db, tmp_path):
    files = FileStore(Settings(data_dir=tmp_path), db)
    store = BatchStore(db)
    owner = _key(1)
    source, _ = files.upload(owner, "in.jsonl", "batch", LINE + LINE.replace(b'"a"', b'"b"') + LINE.replace(b'"a"', b'"c"'))
    batch = store.create(owner, source.id, "/v1/chat/completions", "24h", None)
    ok = {"object": "chat.completion"}
    store.record(batch.id, LineResult(0, "a", "req_charged", 200, True, ok), done=False)  # charged, then the crash
    store.record(batch.id, LineResult(1, "b", "req_lost", 200, True, ok), done=False)  # the crash came before the charge
    store.record(batch.id, LineResult(2, "c", None, 429, False, {"error": {"code": "insufficient_quota"}}), done=True)
    _usage(db, "req_charged")
    assert store.done_lines(batch.id) == {2}
    assert store.recover() == (1, 1)
    assert store.done_lines(batch.id) == {0, 2}  # line 1 runs again; line 0 is not run (nor charged) twice
    assert store.counts([batch.id]) == {batch.id: (1, 1)}
    assert store.recover() == (0, 0)


def test_only_the_owner_and_admins_see_files_and_batches(db, tmp_path):
    files = FileStore(Settings(data_dir=tmp_path), db)
    store = BatchStore(db)
    owner, other, admin = _key(1), _key(2), _key(3, role="admin")
    source, _ = files.upload(owner, "in.jsonl", "batch", LINE)
    batch = store.create(owner, source.id, "/v1/chat/completions", "24h", {"a": "b"})
    for who in (other, _key(4)):
        with pytest.raises(NotFound):
            files.get(who, source.id)
        with pytest.raises(NotFound):
            store.get(who, batch.id)
        with pytest.raises(NotFound):
            store.create(who, source.id, "/v1/chat/completions", "24h", None)
        assert store.list(who, None, 10) == ([], False)
    assert files.get(admin, source.id).id == source.id and store.get(LOCAL_ADMIN, batch.id).id == batch.id
    with pytest.raises(Conflict):
        files.delete(owner, source.id)  # a batch still reads it
    with pytest.raises(BadRequest):
        store.create(owner, source.id, "/v1/embeddings", "24h", None)  # its lines are chat completions
    with pytest.raises(BadRequest):
        store.create(owner, source.id, "/v1/chat/completions", "48h", None)
    with pytest.raises(NotFound):
        files.path("file-../../etc/passwd")
    assert (tmp_path / "files" / f"{source.id}.jsonl").stat().st_mode & 0o777 == 0o600
