"""The Requests and Batches pages in headless Chromium against the real daemon: a refused request is found by the
x-request-id its client got, with no CLI and no restart; Usage counts it and links to it; a running batch is
listed with its progress and cancelled from its page."""

from __future__ import annotations

import io
import json
import time

import httpx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LINES = 20_000  # lines naming a model nobody has: each fails at once, one at a time, so the batch runs a while


def _refused(base: str) -> str:
    with httpx.Client(base_url=base, timeout=60) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": "Bearer sk-wrong-key-for-the-console-test"},
        )
    assert response.status_code == 401
    return response.headers["x-request-id"]


def test_a_refused_request_is_found_by_its_request_id(signed_in, console_daemon):
    request_id = _refused(console_daemon.url)
    s = signed_in("otto")  # an operator
    s.goto("/requests")
    s.page.fill("[data-testid=filter-request-id]", request_id)
    with s.page.expect_navigation():
        s.page.click("[data-testid=filter-apply]")
    rows = s.page.locator("[data-testid=request-row]")
    assert rows.count() == 1
    assert rows.locator("[data-testid=request-id]").inner_text() == request_id
    assert rows.locator("[data-testid=request-status]").inner_text() == "401"
    assert rows.locator("[data-testid=request-reason]").inner_text() == "invalid_api_key"
    s.shoot("requests")
    exported = s.page.request.get(f"{console_daemon.url}/requests.csv?request_id={request_id}")
    assert exported.status == 200
    header, row = exported.text().splitlines()
    assert header.startswith("time,request_id,") and f",{request_id}," in row and ",401,invalid_api_key," in row

    # Usage counts the refusal by its reason and links to the filtered log
    s.goto("/usage?range=today")
    reasons = s.page.locator("[data-testid=refusal-row]", has_text="invalid_api_key")
    assert int(reasons.locator("[data-testid=refusal-link]").inner_text()) >= 1
    with s.page.expect_navigation():
        reasons.locator("[data-testid=refusal-link]").click()
    assert "reason=invalid_api_key" in s.page.url
    ids = s.page.locator("[data-testid=request-id]").all_inner_texts()
    assert request_id in ids


def test_the_audit_log_links_a_key_to_its_requests(signed_in, console_daemon):
    admin_key = console_daemon.create_key("console-audit-admin", role="admin")
    with httpx.Client(base_url=console_daemon.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as client:
        made = client.post("/admin/keys/", json={"name": "made-by-a-key"})
        assert made.status_code in (200, 201), made.text
        request_id = made.headers["x-request-id"]
    s = signed_in("otto")
    s.goto("/audit")
    link = s.page.locator("[data-testid=audit-key-requests]", has_text=admin_key[:12]).first
    with s.page.expect_navigation():
        link.click()
    assert f"key={admin_key[:12]}" in s.page.url
    assert request_id in s.page.locator("[data-testid=request-id]").all_inner_texts()


def test_a_viewer_cannot_open_the_request_log(signed_in, console_daemon):
    s = signed_in("victor")
    s.goto("/")
    assert s.page.locator("nav a[href='/requests']").count() == 0
    assert s.page.locator("nav a[href='/batches']").count() == 1
    assert s.page.request.get(console_daemon.url + "/requests").status == 403
    assert s.page.request.get(console_daemon.url + "/requests.csv").status == 403


def _start_batch(base: str, secret: str) -> str:
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            }
        ).encode()
        + b"\n"
        for i in range(LINES)
    )
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=120) as client:
        upload = client.post("/v1/files", files={"file": ("lines.jsonl", io.BytesIO(lines))}, data={"purpose": "batch"})
        assert upload.status_code == 200, upload.text
        batch = client.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        assert batch.status_code == 200, batch.text
        return batch.json()["id"]


def _wait_for_a_failed_line(base: str, secret: str, batch_id: str) -> None:
    """Validating 20,000 lines takes a while on a busy box: a batch cancelled before its first line ran has no error file."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
        deadline = time.monotonic() + 120
        while client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["failed"] == 0:
            assert time.monotonic() < deadline, "no line of the batch ran within 120 s"
            time.sleep(0.1)


def test_batches_are_listed_and_an_operator_cancels_one(signed_in, console_daemon):
    secret = console_daemon.create_key("console-batches")
    batch_id = _start_batch(console_daemon.url, secret)
    _wait_for_a_failed_line(console_daemon.url, secret, batch_id)  # running: cancelled, its error file has lines
    s = signed_in("otto")
    s.goto("/batches")
    row = s.page.locator("[data-testid=batch-row]", has_text=batch_id)
    assert row.count() == 1
    assert row.locator("[data-testid=batch-status]").inner_text() in ("validating", "in_progress")
    assert "console-batches" in row.inner_text() and f"of {LINES}" in row.inner_text()
    with s.page.expect_navigation():
        row.locator(f"a[href='/batches/{batch_id}']").click()
    s.shoot("batch")
    with s.page.expect_response(lambda r: r.url.endswith(f"/batches/{batch_id}/cancel")) as answer:
        s.page.click("[data-testid=cancel-batch]")  # the confirmation dialog is accepted
    assert answer.value.status == 200
    s.page.wait_for_selector("[data-testid=batch-progress]")
    assert s.page.locator("[data-testid=batch-status]").inner_text() in ("cancelling", "cancelled")
    with httpx.Client(base_url=console_daemon.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
        status = client.get(f"/v1/batches/{batch_id}").json()
    assert status["status"] in ("cancelling", "cancelled")
    assert status["request_counts"]["completed"] + status["request_counts"]["failed"] < LINES

    # a viewer sees the batch, but no cancel button
    viewer = signed_in("victor")
    viewer.goto(f"/batches/{batch_id}")
    assert viewer.page.locator("[data-testid=batch-status]").count() == 1
    assert viewer.page.locator("[data-testid=cancel-batch]").count() == 0

    # once cancelled, its failed lines are in an error file that admins, and only admins, download
    with httpx.Client(base_url=console_daemon.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
        for _ in range(600):
            if client.get(f"/v1/batches/{batch_id}").json()["status"] == "cancelled":
                break
            time.sleep(0.1)
    errors_url = f"{console_daemon.url}/batches/{batch_id}/errors"
    assert s.page.request.get(errors_url).status == 403  # an operator
    admin = signed_in("alice")
    admin.goto(f"/batches/{batch_id}")
    assert admin.page.locator("[data-testid=batch-status]").inner_text() == "cancelled"
    assert admin.page.locator("[data-testid=errors-file]").get_attribute("href") == f"/batches/{batch_id}/errors"
    download = admin.page.request.get(errors_url)
    assert download.status == 200
    lines = [json.loads(line) for line in download.text().splitlines()]
    assert lines and all(line["response"]["body"]["error"]["code"] == "model_not_found" for line in lines)
