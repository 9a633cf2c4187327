"""Secrets in logs and errors (reliability-table row 10), and log rotation.

Unit part: :mod:`appliance.logs` masks secrets in messages, arguments,
tracebacks and structured fields, in both formats, and rotates its file.

Daemon part: a canary API key is used every way a client can use a key (and
misuse it), its engine is killed under it, it is rate limited and revoked.
Afterwards the secret part of the key is in no log file, not in the daemon's
stderr, not in the audit log, no error body or response header, and not in a
dump of the whole database. No error body carries an absolute path.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
import re
import signal
import sqlite3
import sys

import httpx
import pytest

from appliance.accounts.keys import new_token
from appliance.logs import JsonFormatter, RedactingFilter, redact, setup_logging
from tests.reliability.kit import NO_EOS, TINY, chat_body, instances, load, start_tiny_daemon, wait_until

CANARY = new_token()
SECRET_PART = CANARY[12:]  # everything but the visible prefix


def leaks(text: str, secret: str) -> bool:
    """Whether any 10 consecutive characters of the secret part of ``secret`` appear in ``text``."""
    hidden = secret[12:]
    return any(hidden[i : i + 10] in text for i in range(len(hidden) - 9))


# ------------------------------------------------------------------ unit: redact()
@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {CANARY}",
        f"authorization: bearer {CANARY}",
        f"x-api-key: {CANARY}",
        f"{{'api_key': '{CANARY}'}}",
        f'{{"api_key": "{CANARY}"}}',
        f"GET /v1/models?api_key={CANARY}&x=1",
        f"token={CANARY}",
        f"key {CANARY} was refused",
        f"Invalid API key {CANARY[:-1]}",  # a mistyped key is still a secret
    ],
)
def test_api_keys_are_masked_in_every_shape(text):
    cleaned = redact(text)
    assert not leaks(cleaned, CANARY), cleaned
    if "Bearer" not in text and "bearer" not in text:
        assert CANARY[:12] in cleaned or "[redacted]" in cleaned  # the prefix may stay: it identifies the key


@pytest.mark.parametrize(
    "text, secret",
    [
        ('{"password": "hunter2hunter2"}', "hunter2hunter2"),
        ("{'password': 'hunter2hunter2'}", "hunter2hunter2"),
        ("password=hunter2hunter2", "hunter2hunter2"),
        ("session_secret='s3cr3tv4lue99'", "s3cr3tv4lue99"),
        ("Authorization: Bearer sk-abcdefabcdef", "sk-abcdefabcdef"),
        ("vllm serve --api-key abcdefgh12345", "abcdefgh12345"),
        ("hub answered 403 for hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"),
    ],
)
def test_other_secrets_are_masked(text, secret):
    assert secret not in redact(text)


@pytest.mark.parametrize("text", ["max_tokens=5 tokens_per_day=7", "loaded tiny:f32 in 1.2 s", "prompt_tokens: 12"])
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


def _record(msg: str, *args: object, exc: BaseException | None = None, fields: dict | None = None) -> logging.LogRecord:
    record = logging.LogRecord("appliance.test", logging.ERROR, __file__, 1, msg, args, None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    if fields is not None:
        record.fields = fields  # type: ignore[attr-defined]
    return record


def _formatted(record: logging.LogRecord, fmt: str) -> str:
    """A record as setup_logging's handler writes it."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("debug", fmt, None)
        handler = root.handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(stream)
        handler.handle(record)
    finally:
        root.handlers[:], root.level = saved
    return stream.getvalue()


def _raise_with(secret: str) -> BaseException:
    try:
        raise ValueError(f"upstream refused Authorization: Bearer {secret}")
    except ValueError as exc:
        return exc


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_formatted_records_never_carry_a_key(fmt):
    records = [
        _record("request with %s", f"Bearer {CANARY}"),
        _record("headers: %r", {"authorization": f"Bearer {CANARY}", "x-api-key": CANARY}),
        _record("failed", exc=_raise_with(CANARY)),
        _record("engine said", fields={"argv": ["--api-key", CANARY], "headers": {"authorization": f"Bearer {CANARY}"}}),
        _record("engine said", fields={"api_key": CANARY, "detail": f"key={CANARY}"}),
    ]
    for record in records:
        line = _formatted(record, fmt)
        assert line and not leaks(line, CANARY), line


def test_json_lines_stay_json_after_redaction():
    line = _formatted(_record("a %s", f"Bearer {CANARY}", fields={"model": TINY, "api_key": CANARY}), "json")
    entry = json.loads(line)
    assert entry["model"] == TINY and entry["level"] == "error" and "[redacted]" in entry["msg"]


def test_redacting_filter_is_on_every_handler(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", "json", tmp_path)
        assert len(root.handlers) == 2
        assert all(any(isinstance(f, RedactingFilter) for f in h.filters) for h in root.handlers)
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved


# ------------------------------------------------------------------ unit: rotation
def test_log_file_rotates_past_max_bytes_and_keeps_a_bounded_number_of_files(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", "json", tmp_path)
        handler = next(h for h in root.handlers if isinstance(h, logging.handlers.RotatingFileHandler))
        assert handler.maxBytes == 20 * 1024 * 1024 and handler.backupCount == 5  # the shipped limits
        handler.maxBytes = 64 * 1024  # the same mechanism at a size a test can fill quickly
        stderr, sys.stderr = sys.stderr, io.StringIO()
        root.handlers[0].setStream(sys.stderr)
        try:
            log = logging.getLogger("appliance.rotation")
            for i in range(3000):  # ~600 KB: ten rotations' worth
                log.info("line %05d %s key %s", i, "x" * 100, CANARY)
        finally:
            sys.stderr = stderr
        handler.flush()
    finally:
        for h in root.handlers:
            h.close()
        root.handlers[:], root.level = saved
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["appliance.log"] + [f"appliance.log.{i}" for i in range(1, 6)]
    for path in tmp_path.iterdir():
        assert path.stat().st_size <= 64 * 1024
        text = path.read_text()
        assert not leaks(text, CANARY)
        assert all(json.loads(line)["logger"] == "appliance.rotation" for line in text.splitlines())
    assert "line 02999" in (tmp_path / "appliance.log").read_text()  # the newest lines are in the live file


# ------------------------------------------------------------------ daemon: the canary
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+-]+/)+[\w.@+-]*")
API_PREFIXES = ("/v1/", "/admin/", "/openapi/")  # routes named in messages are not file paths


@pytest.mark.slow
def test_canary_key_is_nowhere_and_errors_carry_no_paths(tmp_path_factory, tiny_gguf):
    box = start_tiny_daemon(tmp_path_factory.mktemp("canary"), tiny_gguf, APPLIANCE_LOG_LEVEL="debug")
    errors: list[tuple[str, int, str]] = []
    headers_seen: list[str] = []

    def note(label: str, response: httpx.Response) -> httpx.Response:
        headers_seen.append(json.dumps(dict(response.headers)))
        if response.status_code >= 400 or '"error"' in response.text:  # error events inside a 200 stream too
            errors.append((label, response.status_code, response.text))
        return response

    try:
        admin_key = box.create_key("canary-admin", role="admin")
        with box.admin() as admin:  # the canary is made through the public API, by an admin key
            created = httpx.post(
                box.url + "/admin/keys/", json={"name": "canary"}, headers={"Authorization": f"Bearer {admin_key}"}
            )
            assert created.status_code == 201
            canary = created.json()["secret"]
            prefix = canary[:12]
            assert admin.put(f"/admin/quotas/key:{prefix}", json={"requests_per_minute": 40}).status_code == 200
        load(box)
        bearer = {"Authorization": f"Bearer {canary}"}
        with httpx.Client(base_url=box.url, timeout=120) as client:
            # ordinary use
            note("chat", client.post("/v1/chat/completions", headers=bearer, json=chat_body("hello")))
            with client.stream("POST", "/v1/chat/completions", headers=bearer, json=chat_body("hello", stream=True)) as s:
                s.read()
                note("stream", s)
            note("embeddings", client.post("/v1/embeddings", headers={"x-api-key": canary}, json={"model": TINY, "input": "hi"}))
            note("models", client.get("/v1/models", headers=bearer))
            # misuse and mistakes
            note("unknown model", client.post("/v1/chat/completions", headers=bearer, json=chat_body(model="no-such-model")))
            note(
                "bad json",
                client.post("/v1/chat/completions", headers={**bearer, "content-type": "application/json"}, content=b"{nope"),
            )
            note(
                "bad field",
                client.post("/v1/chat/completions", headers=bearer, json={"model": TINY, "messages": "x", "max_tokens": -1}),
            )
            note("wrong method", client.get("/v1/chat/completions", headers=bearer))
            note("no route", client.get("/v1/nope", headers=bearer))
            note("admin route", client.get("/admin/keys/", headers=bearer))
            note("admin delete", client.delete(f"/admin/keys/{prefix}", headers=bearer))
            note("lowercase scheme", client.get("/v1/models", headers={"authorization": f"bearer {canary}x"}))
            note("mangled", client.get("/v1/models", headers={"Authorization": f"Bearer {canary[:-2]}"}))
            note("in query", client.get(f"/v1/models?api_key={canary}"))
            note("basic", client.get("/v1/models", headers={"Authorization": f"Basic {canary}"}))
            note("console", client.get("/", headers=bearer))
            note("bad host", client.get("/v1/models", headers={**bearer, "host": "evil.example"}))
            note("huge body", client.post("/v1/chat/completions", headers=bearer, json=chat_body("x" * 200_000, max_tokens=1)))
            # the engine dies under the key's request
            pid = int(instances(box)[TINY]["pid"])
            with client.stream(
                "POST",
                "/v1/chat/completions",
                headers=bearer,
                json=chat_body("long", max_tokens=400, logit_bias=NO_EOS, stream=True),
            ) as s:
                os.kill(pid, signal.SIGKILL)
                s.read()
                note("engine killed", s)
            wait_until(
                lambda: instances(box)[TINY]["state"] == "ready" and instances(box)[TINY]["pid"] != pid, 60, 0.2, "restart"
            )
            # rate limited, then revoked
            for _ in range(45):
                response = client.post("/v1/chat/completions", headers=bearer, json=chat_body("again"))
                if response.status_code == 429:
                    note("rate limited chat", response)
                    break
            with box.admin() as admin:
                assert admin.delete(f"/admin/keys/{prefix}").status_code == 200
            note("revoked", client.post("/v1/chat/completions", headers=bearer, json=chat_body("after revoke")))
        # errors only the admin sees
        with box.admin() as admin:
            note("import missing", admin.post("/admin/models/import", json={"path": "relative/nowhere.gguf", "name": "x:y"}))
            note("delete loaded", admin.delete(f"/admin/models/{TINY}"))
            note("load missing", admin.post("/admin/instances/no-such/load"))
            note("quota bad", admin.put(f"/admin/quotas/key:{prefix}", json={"tokens_per_day": -5}))
            note("pull internal", admin.post("/admin/models/pull", json={"url": "http://169.254.169.254/x.gguf", "name": "x:y"}))
    finally:
        box.stop()

    statuses = {label: status for label, status, _ in errors}
    assert (statuses["revoked"], statuses["admin route"], statuses["unknown model"], statuses["bad field"]) == (
        401,
        403,
        404,
        400,
    )
    bodies = {label: b for label, _, b in errors}
    assert statuses["rate limited chat"] == 429 and "engine_unavailable" in bodies["engine killed"]

    # The secret part of the canary is nowhere.
    places = {f"log file {p.name}": p.read_text(errors="replace") for p in (box.data_dir / "logs").glob("*.log*")}
    places["daemon stdout/stderr"] = box.log()
    conn = sqlite3.connect(box.data_dir / "appliance.db")
    try:
        places["database dump"] = "\n".join(conn.iterdump())
        places["audit log"] = json.dumps(conn.execute("SELECT * FROM audit_log").fetchall())
        assert conn.execute("SELECT count(*) FROM audit_log WHERE target = ?", (prefix,)).fetchone()[0] >= 2  # create, revoke
    finally:
        conn.close()
    places["error bodies"] = json.dumps(errors)
    places["response headers"] = "\n".join(headers_seen)
    assert len(places["daemon stdout/stderr"]) > 1000 and places["log file appliance.log"]
    found = [where for where, text in places.items() if leaks(text, canary)]
    assert found == []
    assert prefix in places["audit log"]  # the visible prefix is how admins name a key

    # Errors carry no absolute paths (of the data dir, the code, or anything else).
    def paths(body: str) -> list[str]:
        return [p for p in ABSOLUTE_PATH.findall(body) if not p.startswith(API_PREFIXES)]

    with_paths = [(label, status, paths(body)) for label, status, body in errors if paths(body)]
    assert with_paths == []
    for label, _status, body in errors:
        assert str(box.data_dir) not in body and "Traceback" not in body and ".py" not in body, (label, body)
