"""The request log through the real daemon: every request answered, served, refused or failed, found by the
``x-request-id`` its client got, with the reason the error handler gave; pruned by age and by row count; bounded
under a flood of anonymous 401s; and never holding a secret or a body.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from appliance.requestlog.writer import TRIM_SLACK
from tests.daemon import RunningDaemon, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

MODEL = "logged-tiny:f32"
MAX_ROWS = 1000
BAD_SECRET = "sk-not-a-key-c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1iZS1sb2dnZWQ"
PROMPT = "The violet heron counts seventeen lanterns"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("requestlog")
    model = make_tiny_gguf(folder / "tiny.gguf", seed=7)
    running = start_daemon(folder, APPLIANCE_REQUEST_LOG_MAX_ROWS=str(MAX_ROWS), APPLIANCE_CACHE_ENABLED="false")
    try:
        import_model(running, model, MODEL)
        yield running
    finally:
        running.stop()


def _logged(box: RunningDaemon, request_id: str, timeout: float = 10.0) -> dict:
    """The request log's row for ``request_id``, once the writer has written it."""
    deadline = time.monotonic() + timeout
    with box.admin() as admin:
        while True:
            answer = admin.get("/admin/requests", params={"request_id": request_id})
            assert answer.status_code == 200, answer.text
            rows = answer.json()["data"]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert len(rows) == 1, f"{request_id} is not in the request log"
    return rows[0]


def _chat(model: str = MODEL, content: str = "Hello", **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def test_served_refused_and_failed_requests_are_logged_with_their_reason_and_id(box):
    secret = box.create_key("logged")
    prefix = secret[:12]
    over_quota = box.create_key("logged-over-quota")
    with box.admin() as admin:
        admin.put(f"/admin/quotas/key:{over_quota[:12]}", json={"tokens_per_day": 1}).raise_for_status()
    cases = []
    with httpx.Client(base_url=box.url, timeout=120) as client:
        cases.append(
            ("401", client.post("/v1/chat/completions", json=_chat(), headers={"Authorization": f"Bearer {BAD_SECRET}"}))
        )
        auth = {"Authorization": f"Bearer {secret}"}
        cases.append(("404", client.post("/v1/chat/completions", json=_chat("no-such-model"), headers=auth)))
        cases.append(("400", client.post("/v1/chat/completions", json={"model": MODEL, "messages": "not a list"}, headers=auth)))
        quota_auth = {"Authorization": f"Bearer {over_quota}"}
        cases.append(("429", client.post("/v1/chat/completions", json=_chat(content=PROMPT), headers=quota_auth)))
        cases.append(("200", client.post("/v1/chat/completions", json=_chat(content=PROMPT), headers=auth)))
        cases.append(("no route", client.get("/v1/nothing-here", headers=auth)))
        cases.append(("403", client.get("/admin/requests", headers=auth)))  # a user key on an admin route
    expected = {
        "401": (401, "invalid_api_key", None),
        "404": (404, "model_not_found", prefix),
        "400": (400, "invalid_request_error", prefix),
        "429": (429, "insufficient_quota", over_quota[:12]),
        "200": (200, None, prefix),
        "no route": (404, "not_found", None),  # no route: no guard ran, so no key was read
        "403": (403, "permission_denied", prefix),
    }
    endpoints = {"no route": "(no route)", "403": "/admin/requests"}
    for name, response in cases:
        status, reason, key = expected[name]
        assert response.status_code == status, (name, response.text)
        request_id = response.headers["x-request-id"]
        row = _logged(box, request_id)
        assert (row["status"], row["reason"], row["key"]) == (status, reason, key), (name, row)
        assert row["method"] == ("GET" if name in endpoints else "POST")
        assert row["endpoint"] == endpoints.get(name, "/v1/chat/completions")
        assert row["address"] == "127.0.0.1"
    served = _logged(box, cases[4][1].headers["x-request-id"])
    usage = cases[4][1].json()["usage"]
    assert (served["prompt_tokens"], served["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert served["model"] == MODEL
    assert _logged(box, cases[1][1].headers["x-request-id"])["model"] == "no-such-model"  # as the body named it
    # the same rows, filtered by outcome and reason
    with box.admin() as admin:
        refused = admin.get("/admin/requests", params={"status": "refused", "reason": "insufficient_quota"}).json()["data"]
        assert [r["request_id"] for r in refused] == [cases[3][1].headers["x-request-id"]]
        by_key = admin.get("/admin/requests", params={"key": prefix, "status": "served"}).json()["data"]
        assert [r["request_id"] for r in by_key] == [cases[4][1].headers["x-request-id"]]
        assert admin.get("/admin/requests", params={"status": "teapot"}).status_code == 400


def test_a_stream_the_client_leaves_is_logged_as_499_client_disconnected(box):
    secret = box.create_key("logged-stream")
    body = _chat(content="Count from one to a thousand", stream=True, max_tokens=1500)
    auth = {"Authorization": f"Bearer {secret}"}
    with (
        httpx.Client(base_url=box.url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=auth) as answer,
    ):
        assert answer.status_code == 200
        request_id = answer.headers["x-request-id"]
        next(answer.iter_raw())  # the first event, then hang up
    row = _logged(box, request_id)
    assert (row["status"], row["reason"]) == (499, "client_disconnected"), row


def test_probes_assets_and_page_views_are_not_logged_but_refused_pages_are(box):
    with httpx.Client(base_url=box.url, timeout=60) as client:
        quiet = [client.get(path) for path in ("/healthz", "/readyz", "/static/console.css", "/login", "/docs/")]
        assert [r.status_code for r in quiet] == [200, 200, 200, 200, 303], [r.status_code for r in quiet]  # /docs/: sign in
        refused_page = client.post("/keys/new", data={"name": "x"})  # no session, no CSRF token
        assert refused_page.status_code >= 400
        marker = client.get("/v1/models")  # no key: 401, logged after the others
    assert _logged(box, marker.headers["x-request-id"])["reason"] == "invalid_api_key"
    with box.admin() as admin:
        for answer in quiet:
            rows = admin.get("/admin/requests", params={"request_id": answer.headers["x-request-id"]}).json()["data"]
            assert rows == [], answer.request.url
    assert _logged(box, refused_page.headers["x-request-id"])["status"] == refused_page.status_code


def test_no_secret_query_string_or_body_reaches_the_database(box):
    secret = box.create_key("logged-secrets")
    with httpx.Client(base_url=box.url, timeout=120) as client:
        refused = client.post(
            "/v1/chat/completions?api_key=" + BAD_SECRET, json=_chat(content=PROMPT), headers={"x-api-key": BAD_SECRET}
        )
        assert refused.status_code == 401
        served = client.post("/v1/chat/completions", json=_chat(content=PROMPT), headers={"Authorization": f"Bearer {secret}"})
        assert served.status_code == 200, served.text
    for answer in (refused, served):
        _logged(box, answer.headers["x-request-id"])
    with sqlite3.connect(box.data_dir / "appliance.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(FULL)")
    stored = b"".join(p.read_bytes() for p in box.data_dir.glob("appliance.db*"))
    for text in (BAD_SECRET, secret, PROMPT, "api_key="):
        assert text.encode() not in stored, f"{text!r} is in the database"


def test_a_flood_of_anonymous_401s_keeps_the_log_bounded(box):
    process = psutil.Process(box.proc.pid)
    before = process.memory_info().rss
    flood = 6_000

    def knock(n: int) -> int:
        with httpx.Client(base_url=box.url, timeout=30) as client:
            return sum(
                client.get("/v1/models", headers={"Authorization": f"Bearer sk-flood-{i}"}).status_code == 401 for i in range(n)
            )

    started = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        refused = sum(pool.map(knock, [flood // 6] * 6))
    took = time.monotonic() - started
    assert refused == flood
    time.sleep(1.0)  # the writer's last batch
    with sqlite3.connect(box.data_dir / "appliance.db") as conn:
        rows = conn.execute("SELECT count(*) FROM request_log").fetchone()[0]
        newest = conn.execute("SELECT reason FROM request_log ORDER BY id DESC LIMIT 1").fetchone()[0]
    grown = (process.memory_info().rss - before) / 2**20
    with box.admin() as admin:
        dropped = admin.get("/admin/requests", params={"limit": 1}).json()["dropped"]
    print(f"{flood} 401s in {took:.1f} s; {rows} rows kept (cap {MAX_ROWS}), {dropped} dropped, RSS {grown:+.1f} MiB")
    assert MAX_ROWS <= rows <= MAX_ROWS + TRIM_SLACK
    assert newest == "invalid_api_key"
    assert grown < 64


def test_the_scheduler_prunes_rows_past_the_age_and_the_cap(box):
    box.stop()
    now = time.time()
    with sqlite3.connect(box.data_dir / "appliance.db") as conn:
        conn.execute("DELETE FROM request_log")
        old = [(now - 20 * 86400, f"req_old{i}", "GET", "/v1/models", 401, "invalid_api_key", 1.0) for i in range(50)]
        recent = [(now - 60 + i / 100, f"req_new{i}", "GET", "/v1/models", 401, "invalid_api_key", 1.0) for i in range(1_500)]
        conn.executemany(
            "INSERT INTO request_log (created_at, request_id, method, endpoint, status, reason, latency_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            old + recent,
        )
    box.start()  # the scheduler prunes at start, then every minute
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(box.data_dir / "appliance.db") as conn:
            oldest = conn.execute("SELECT min(created_at), count(*) FROM request_log WHERE request_id LIKE 'req_%'").fetchone()
            kept = conn.execute("SELECT count(*) FROM request_log WHERE request_id LIKE 'req_new%'").fetchone()[0]
        if oldest[0] is not None and oldest[0] > now - 86400 and kept <= MAX_ROWS:
            break
        time.sleep(0.5)
    assert oldest[0] > now - 14 * 86400, "rows past request_log_days are still there"
    assert kept <= MAX_ROWS
    with sqlite3.connect(box.data_dir / "appliance.db") as conn:
        newest = [r for (r,) in conn.execute("SELECT request_id FROM request_log WHERE request_id LIKE 'req_new%' ORDER BY id")]
    assert newest[-1] == "req_new1499"  # the newest stay
