"""OpenAI's Batch API with the official `openai` client, against the real daemon and llama.cpp engine on a tiny model.

Upload, create, poll and download; a SIGKILL mid-batch; cancel; another key's view; a budget that runs out
mid-batch; per-line checks and size limits on upload. The ledger is read from the daemon's own SQLite file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import openai
import pytest

from tests.daemon import RunningDaemon, _descendants, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

MODEL = "batch-tiny:f32"
MAX_FILE = 48 * 1024
TERMINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch")
    model = make_tiny_gguf(folder / "batch.gguf", seed=5)
    running = start_daemon(folder, APPLIANCE_FILES_MAX_BYTES=str(MAX_FILE), APPLIANCE_FILES_QUOTA_BYTES_PER_KEY=str(4 * MAX_FILE))
    try:
        import_model(running, model, MODEL)
        with running.admin() as admin:
            admin.put(
                "/admin/prices/*", json={"input_per_m": 1000.0, "output_per_m": 3000.0, "cached_per_m": 1000.0}
            ).raise_for_status()
        yield running
    finally:
        running.stop()


def _key(box: RunningDaemon, name: str, **fields: object) -> tuple[str, openai.OpenAI]:
    secret = box.create_key(name, **fields)
    return secret, openai.OpenAI(base_url=box.url + "/v1", api_key=secret, max_retries=0, timeout=300)


def _lines(n: int, max_tokens: int = 4, *, prefix: str = "req") -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"{prefix}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Number {i} please"}],
                    "max_tokens": max_tokens,
                },
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


def _upload(client: openai.OpenAI, content: bytes, name: str = "input.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(content)), purpose="batch").id


def _wait(client: openai.OpenAI, batch_id: str, until=lambda b: b.status in TERMINAL, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout} s: {batch.request_counts}")


def _ledger(box: RunningDaemon, batch_id: str) -> list[tuple[int, int, int, float]]:
    with sqlite3.connect(box.data_dir / "appliance.db") as db:
        return db.execute(
            "SELECT status, prompt_tokens, completion_tokens, cost FROM usage WHERE batch_id = ?", (batch_id,)
        ).fetchall()


def _ctl(box: RunningDaemon, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args],
        env={**box.env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _jsonl(text: bytes | str) -> list[dict]:
    raw = text.decode() if isinstance(text, bytes) else text
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def test_fifty_lines_upload_run_download(box):
    _, client = _key(box, "batch-owner")
    file_id = _upload(client, _lines(50))
    described = client.files.retrieve(file_id)
    assert (described.purpose, described.bytes) == ("batch", len(_lines(50)))
    assert (box.data_dir / "files" / f"{file_id}.jsonl").stat().st_mode & 0o777 == 0o600
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "nightly"}
    )
    assert batch.status in {"validating", "in_progress"} and batch.request_counts.total == 50
    done = _wait(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (50, 0)
    assert done.error_file_id is None and done.metadata == {"job": "nightly"}
    output = _jsonl(client.files.content(done.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(50))
    for line in output:
        assert line["error"] is None and line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["request_id"]
    rows = _ledger(box, batch.id)
    assert len(rows) == 50 and {r[0] for r in rows} == {200}
    # batch_price_factor 0.5 of the list price (1000 / 3000 per million prompt / completion tokens, cached as prompt)
    for _, prompt, completion, cost in rows:
        assert cost == pytest.approx(0.5 * (prompt * 1000 + completion * 3000) / 1e6)
    listed = client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]


def test_a_second_key_sees_nothing_of_the_first(box):
    _, owner = _key(box, "batch-isolation-owner")
    _, other = _key(box, "batch-isolation-other")
    admin_secret, admin = _key(box, "batch-isolation-admin", role="admin")
    file_id = _upload(owner, _lines(3))
    batch = owner.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
        lambda: other.files.delete(file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in other.batches.list().data]
    assert file_id not in [f.id for f in other.files.list().data]
    assert admin.batches.retrieve(batch.id).id == batch.id  # admins see every batch
    second = owner.batches.create(
        input_file_id=_upload(owner, _lines(1)), endpoint="/v1/chat/completions", completion_window="24h"
    )
    first_page = owner.batches.list(limit=1)
    assert [b.id for b in first_page.data] == [second.id] and first_page.has_more
    assert [b.id for b in owner.batches.list(limit=1, after=second.id).data] == [batch.id]
    assert [b.id for b in owner.batches.list(limit=1)] == [second.id, batch.id]  # the SDK follows `after` page by page
    done = _wait(owner, batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id)
    assert len(_jsonl(owner.files.content(done.output_file_id).text)) == 3
    assert admin_secret


def test_cancel_stops_new_lines(box):
    _, client = _key(box, "batch-cancel")
    file_id = _upload(client, _lines(60, max_tokens=48, prefix="c"))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"}
    done = _wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert 2 <= done.request_counts.completed < 60
    output = _jsonl(client.files.content(done.output_file_id).text)
    assert len(output) == done.request_counts.completed
    assert len([r for r in _ledger(box, batch.id) if r[0] == 200]) == done.request_counts.completed
    time.sleep(1.0)
    assert client.batches.retrieve(batch.id).request_counts.completed == done.request_counts.completed  # nothing more ran
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling twice changes nothing
    # the CLI, over the admin socket, sees every key's batches with their progress
    progress = f"{done.request_counts.completed}/60"
    listed = _ctl(box, "batches", "ls")
    assert batch.id in listed and progress in listed
    shown = _ctl(box, "batches", "show", batch.id)
    assert "cancelled" in shown and progress in shown and done.output_file_id in shown
    assert f"Batch {batch.id} is cancelled" in _ctl(box, "batches", "cancel", batch.id)


def test_a_batch_past_its_window_expires_its_remaining_lines(box):
    _, client = _key(box, "batch-expiry")
    file_id = _upload(client, _lines(60, max_tokens=300, prefix="e"))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
    with sqlite3.connect(box.data_dir / "appliance.db") as db:  # the 24 hours pass
        db.execute("UPDATE batches SET expires_at = 0 WHERE id = ?", (batch.id,))
    done = _wait(client, batch.id)
    assert done.status == "expired" and done.expired_at is not None
    counts = done.request_counts
    assert counts.completed >= 2 and counts.failed >= 1 and counts.completed + counts.failed == 60
    expired = _jsonl(client.files.content(done.error_file_id).text)
    assert len(expired) == counts.failed
    assert all(line["response"] is None and line["error"]["code"] == "batch_expired" for line in expired)
    assert len(_jsonl(client.files.content(done.output_file_id).text)) == counts.completed
    assert len(_ledger(box, batch.id)) == counts.completed  # expired lines never ran


def test_budget_running_out_fails_the_remaining_lines_with_the_quota_error(box):
    secret, client = _key(box, "batch-budget")
    with box.admin() as admin:
        admin.put(f"/admin/quotas/key:{secret[:12]}", json={"tokens_per_day": 150}).raise_for_status()
    file_id = _upload(client, _lines(30, max_tokens=4, prefix="b"))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    done = _wait(client, batch.id)
    assert done.status == "completed"
    counts = done.request_counts
    assert counts.completed >= 1 and counts.failed >= 1 and counts.completed + counts.failed == 30
    errors = _jsonl(client.files.content(done.error_file_id).text)
    assert len(errors) == counts.failed
    for line in errors:
        assert line["response"]["status_code"] == 429
        assert line["response"]["body"]["error"]["code"] == "insufficient_quota"
        assert line["error"]["code"] == "insufficient_quota"
    output = _jsonl(client.files.content(done.output_file_id).text)
    assert {line["custom_id"] for line in output} | {line["custom_id"] for line in errors} == {f"b-{i}" for i in range(30)}
    rows = _ledger(box, batch.id)
    assert len([r for r in rows if r[0] == 200]) == counts.completed
    with box.admin() as admin:
        spent = admin.get(f"/admin/quotas/key:{secret[:12]}").json()["usage"]["tokens_per_day"]
    assert spent["spent"] <= 150 and spent["reserved"] == 0, spent
    assert spent["spent"] == sum(r[1] + r[2] for r in rows)  # the ledger and the counter agree


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b'["a list"]', "must be a JSON object"),
        (
            b'{"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}',
            "repeats line 1",
        ),
        (b'{"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {"model": "m"}}', "`method`"),
        (b'{"custom_id": "x", "method": "POST", "url": "/v1/../admin/keys", "body": {"model": "m"}}', "`url`"),
        (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}', "`body.model`"),
        (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": "text"}', "`body` must be"),
        (b'{"custom_id": "", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "a"}}', "custom_id"),
        (
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": 5}}',
            "not a valid /v1/chat/completions request",
        ),
        (
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [], '
            b'"stream": true}}',
            "stream",
        ),
    ],
)
def test_upload_names_the_bad_line(box, line, problem):
    _, client = _key(box, "batch-lines")
    content = _lines(1) + b"\n" + line + b"\n"  # the bad line is line 3 (line 2 is blank)
    with pytest.raises(openai.BadRequestError) as raised:
        _upload(client, content)
    message = raised.value.body["message"]
    assert "line 3" in message and problem in message, message
    assert client.files.list().data == []  # nothing kept


def test_oversize_and_over_quota_uploads_are_refused(box):
    _, client = _key(box, "batch-sizes")
    big = _lines(1) * (MAX_FILE // len(_lines(1)) + 20)
    big = b"".join(line.replace(b'"req-0"', f'"r{i}"'.encode()) + b"\n" for i, line in enumerate(big.splitlines()))
    assert MAX_FILE < len(big) < 2 * MAX_FILE
    with pytest.raises(openai.APIStatusError) as raised:  # just over: refused after the form is read
        _upload(client, big)
    assert raised.value.status_code == 413
    with pytest.raises(openai.APIStatusError) as raised:  # far over: refused on its Content-Length, before the body
        _upload(client, big * 40)
    assert raised.value.status_code == 413
    # four files just under the limit fill the key's quota; the fifth is refused
    fits = b"".join(line + b"\n" for line in big.splitlines()[: len(big.splitlines()) * 9 // 10])
    assert len(fits) <= MAX_FILE
    kept = [_upload(client, fits) for _ in range(4)]
    with pytest.raises(openai.APIStatusError) as raised:
        _upload(client, fits)
    assert raised.value.status_code == 413 and "files_quota_bytes_per_key" in raised.value.body["message"]
    client.files.delete(kept[0])
    _upload(client, fits)  # room again once a file is deleted


def test_sigkill_mid_batch_resumes_without_losing_or_repeating_a_line(box):
    """Runs last in the module: it kills (then stops) and restarts the shared daemon."""
    _, client = _key(box, "batch-crash")
    file_id = _upload(client, _lines(50, max_tokens=300, prefix="k"))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    before = _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 8 or b.status in TERMINAL)
    assert before.status == "in_progress", "the batch finished before the kill: make its lines longer"
    _sigkill_all_at_once(box)
    box.start()
    again = _wait(client, batch.id, until=lambda b: b.request_counts.completed >= before.request_counts.completed + 8)
    assert again.status == "in_progress", "the batch finished before the stop: make its lines longer"
    box.stop()  # and a plain stop (SIGTERM) mid-batch: the lines in flight finish first
    box.start()
    done = _wait(client, batch.id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (50, 0)
    output = _jsonl(client.files.content(done.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == sorted(f"k-{i}" for i in range(50))
    rows = _ledger(box, batch.id)
    assert len(rows) == 50 and {r[0] for r in rows} == {200}, rows
    assert {line["response"]["request_id"] for line in output} == set(_request_ids(box, batch.id))


def _sigkill_all_at_once(box: RunningDaemon) -> None:
    """SIGKILL the daemon's process group in one signal (the daemon cannot see its engines die first), then any
    engine outside it."""
    assert box.proc is not None
    engines = _descendants(box.proc.pid)
    os.killpg(box.proc.pid, signal.SIGKILL)
    box.proc.wait(10)
    for pid in engines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _request_ids(box: RunningDaemon, batch_id: str) -> list[str]:
    with sqlite3.connect(box.data_dir / "appliance.db") as db:
        return [r[0] for r in db.execute("SELECT request_id FROM usage WHERE batch_id = ?", (batch_id,))]
