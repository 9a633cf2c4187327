"""Every token the engine processed is charged; a limit counts its whole window (security rows 29 and 30).

Through a real daemon and the tiny model with a long context: streams abandoned
after their first token (on every API surface), a plain request abandoned while
the engine works, a limit set or lowered after the window's spending, the 429 of a
refusal caused by reservations in flight, and the per-key cap on embedding inputs
in flight. The keys and teams tables, ``appliancectl quota show`` and
``/admin/usage`` must agree to the token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon
from tests.reliability.conftest import LONG
from tests.reliability.kit import NO_EOS, TINY, chat_body, db_rows, engine_get, engine_socket, import_model, load, wait_until

pytestmark = pytest.mark.slow
EMBEDDING_CAP = 8
DAY = 86400
CONSOLE_PASSWORD = "a long console passphrase 7"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, long_gguf: Path) -> Iterator[RunningDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    daemon = start_daemon(
        tmp_path_factory.mktemp("metering"),
        APPLIANCE_ENGINE_CONTEXT="16384",
        APPLIANCE_ENGINE_PARALLEL="2",
        APPLIANCE_EMBEDDING_INPUTS_IN_FLIGHT_PER_KEY=str(EMBEDDING_CAP),
    )
    try:
        import_model(daemon, long_gguf, TINY)
        engine = make_engine(daemon.data_dir / "appliance.db")
        create_user(engine, "metering-admin", CONSOLE_PASSWORD, role="admin")
        engine.dispose()
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def free_key(box: RunningDaemon) -> str:
    """A key without limits, to learn what a prompt costs."""
    return box.create_key("measure")


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i % 97}" for i in range(n))


def key_with(box: RunningDaemon, name: str, **limits: float) -> str:
    key = box.create_key(name)
    if limits:
        with box.admin() as admin:
            response = admin.put(f"/admin/quotas/key:{key[:12]}", json=limits)
            assert response.status_code == 200, response.text
    return key


def quota(box: RunningDaemon, subject: str) -> dict[str, Any]:
    with box.admin() as admin:
        response = admin.get(f"/admin/quotas/{subject}")
        assert response.status_code == 200, response.text
        return response.json()


def last_id(box: RunningDaemon) -> int:
    return db_rows(box.data_dir, "SELECT coalesce(max(id), 0) FROM usage")[0][0]


def rows_after(box: RunningDaemon, after: int) -> list[tuple]:
    return db_rows(
        box.data_dir,
        "SELECT status, endpoint, prompt_tokens, completion_tokens, key_id FROM usage WHERE id > ? ORDER BY id",
        after,
    )


def one_row_after(box: RunningDaemon, after: int) -> tuple:
    rows = wait_until(lambda: rows_after(box, after), 5.0, 0.05, "the usage row")
    assert len(rows) == 1, rows
    return rows[0]


def engine_idle(box: RunningDaemon) -> bool:
    engine = engine_socket(int(load(box)["pid"]))
    return engine_get(engine, "/stats").json()["slots_busy"] == 0


# -- the surfaces: a plain request to learn the prompt's cost, and a stream cut after its first token -----------------
def _openai_chat(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", chat_body(text, max_tokens=LONG if stream else 1, logit_bias=NO_EOS, stream=stream)


def _openai_completions(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    body = {"model": TINY, "prompt": text, "max_tokens": LONG if stream else 1, "temperature": 0, "logit_bias": NO_EOS}
    return "/v1/completions", {**body, "stream": stream}


def _messages(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    body = {"model": TINY, "max_tokens": LONG if stream else 1, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    return "/v1/messages", {**body, "stream": stream}


def _responses(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    body = {"model": TINY, "input": text, "max_output_tokens": LONG if stream else 16, "temperature": 0, "store": False}
    return "/v1/responses", {**body, "stream": stream}


def _ollama_chat(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    options = {"num_predict": LONG if stream else 1, "temperature": 0}
    return "/api/chat", {"model": TINY, "messages": [{"role": "user", "content": text}], "stream": stream, "options": options}


def _ollama_generate(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    options = {"num_predict": LONG if stream else 1, "temperature": 0}
    return "/api/generate", {"model": TINY, "prompt": text, "stream": stream, "options": options}


SURFACES: dict[str, tuple[Callable[[str, bool], tuple[str, dict[str, Any]]], str]] = {
    # name: (request builder, a line of the stream that carries generated text)
    "chat": (_openai_chat, r'"content":"[^"]'),
    "completions": (_openai_completions, r'"text":"[^"]'),
    "messages": (_messages, r'"type":"content_block_delta"'),
    "responses": (_responses, r"response\.output_text\.delta"),
    "ollama-chat": (_ollama_chat, r'"content":"[^"]'),
    "ollama-generate": (_ollama_generate, r'"response":"[^"]'),
}


def prompt_cost(box: RunningDaemon, key: str, surface: str, text: str) -> int:
    """The prompt tokens the ledger charges ``text`` on ``surface`` (from a plain request that ran to its end)."""
    build, _ = SURFACES[surface]
    path, body = build(text, False)
    before = last_id(box)
    with box.client(key) as client:
        response = client.post(path, json=body, headers={"x-api-key": key})
        assert response.status_code == 200, response.text[:500]
    status, _endpoint, prompt_tokens, _completion, _key = one_row_after(box, before)
    assert status == 200 and prompt_tokens > 0
    return prompt_tokens


def abandon_stream(box: RunningDaemon, key: str, surface: str, text: str) -> int:
    """Stream ``text``, read until the first generated text, hang up; the HTTP status of the answer."""
    build, marker = SURFACES[surface]
    path, body = build(text, True)
    with box.client(key, timeout=60) as client, client.stream("POST", path, json=body, headers={"x-api-key": key}) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code
        for line in response.iter_lines():
            if re.search(marker, line.replace(": ", ":")):
                break
        else:
            raise AssertionError(f"{surface}: the stream ended before any text")
    return 200


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_stream_abandoned_after_its_first_token_is_charged_its_prompt(box, free_key, surface):
    text = words(400, surface[:3])
    prompt_tokens = prompt_cost(box, free_key, surface, text)
    key = key_with(box, f"abandon-{surface}", tokens_per_day=10_000_000)
    before = last_id(box)
    assert abandon_stream(box, key, surface, text) == 200
    status, _endpoint, charged_prompt, completion, _key = one_row_after(box, before)
    assert status == 499, "the stream ran to its end before the client left"
    assert charged_prompt == prompt_tokens  # the whole prompt the engine read, counted exactly
    assert completion >= 1  # the text the client read
    counter = wait_until(
        lambda: (c := quota(box, f"key:{key[:12]}")["usage"]["tokens_per_day"])["reserved"] == 0 and c, 5.0, 0.05, "release"
    )
    assert counter["spent"] == charged_prompt + completion  # the budget saw exactly what the ledger holds
    wait_until(lambda: engine_idle(box), 5.0, 0.05, "the engine's slot freed")


def test_hanging_up_on_streams_cannot_buy_free_prefill(box, free_key):
    """The issue's attack: a small daily budget, long prompts, each stream dropped after its first token."""
    text = words(1200, "free")
    prompt_tokens = prompt_cost(box, free_key, "chat", text)
    limit = 4 * prompt_tokens + prompt_tokens // 2
    key = key_with(box, "free-prefill", tokens_per_day=limit)
    before = last_id(box)
    statuses = []
    for _ in range(6):
        statuses.append(abandon_stream(box, key, "chat", text))
        wait_until(lambda: quota(box, f"key:{key[:12]}")["usage"]["tokens_per_day"]["reserved"] == 0, 5.0, 0.05, "release")
    served = statuses.count(200)
    assert served <= 4 and statuses[served:] == [429] * (6 - served), statuses
    rows = rows_after(box, before)
    assert len(rows) == served and all(r[0] == 499 and r[2] == prompt_tokens for r in rows), rows
    counter = quota(box, f"key:{key[:12]}")["usage"]["tokens_per_day"]
    assert counter["spent"] == sum(r[2] + r[3] for r in rows) <= limit


def test_a_plain_request_abandoned_while_the_engine_works_is_charged_its_prompt(box, free_key):
    text = words(600, "plain")
    prompt_tokens = prompt_cost(box, free_key, "chat", text)
    key = key_with(box, "plain-hangup", tokens_per_day=10_000_000)
    engine = engine_socket(int(load(box)["pid"]))
    payload = json.dumps(chat_body(text, max_tokens=LONG, logit_bias=NO_EOS)).encode()
    before = last_id(box)
    with socket.create_connection(("127.0.0.1", box.port)) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_until(lambda: engine_get(engine, "/stats").json()["slots_busy"] == 1, 30, 0.02, "generation starting")
    status, _endpoint, charged_prompt, _completion, _key = one_row_after(box, before)
    assert (status, charged_prompt) == (499, prompt_tokens)
    wait_until(lambda: quota(box, f"key:{key[:12]}")["usage"]["tokens_per_day"]["spent"] >= prompt_tokens, 5.0, 0.05, "spend")


# -- a limit set mid-window -----------------------------------------------------------------------------------------------
def spend(box: RunningDaemon, key: str, times: int) -> int:
    """Run ``times`` plain chats; the tokens the ledger charged them."""
    before = last_id(box)
    with box.client(key) as client:
        for i in range(times):
            response = client.post("/v1/chat/completions", json=chat_body(words(120, f"s{i}"), max_tokens=60, logit_bias=NO_EOS))
            assert response.status_code == 200, response.text
    rows = rows_after(box, before)
    assert len(rows) == times and all(r[0] == 200 for r in rows)
    return sum(r[2] + r[3] for r in rows)


@contextlib.contextmanager
def console(box: RunningDaemon) -> Iterator[httpx.Client]:
    """A console session of the admin user."""
    with httpx.Client(base_url=box.url, timeout=60) as client:
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text)
        assert token is not None
        response = client.post(
            "/login",
            data={"username": "metering-admin", "password": CONSOLE_PASSWORD, "csrf_token": token.group(1)},
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text[:300]
        yield client


def keys_page(page: httpx.Client) -> str:
    response = page.get("/keys")
    assert response.status_code == 200, (response.status_code, response.headers.get("location"))
    return response.text


def table_limit(html: str, row_attr: str, dimension: str) -> dict[str, str]:
    """The data attributes of one limit badge in the keys page's row ``row_attr`` (``data-key="…"``/``data-team="…"``)."""
    row = html.split(row_attr, 1)[1].split("</tr>", 1)[0]
    match = re.search(rf'<span class="badge[^"]*" data-testid="limit" data-limit="{dimension}"([^>]*)>', row)
    assert match is not None, row[:2000]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(1)))


def cli_quota(box: RunningDaemon, subject: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", "quota", "show", subject, *extra],
        env={**box.env, "COLUMNS": "200"},  # the table at full width
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("earlier", ["no limit", "a larger limit"])
def test_a_limit_set_below_what_the_day_spent_refuses_the_next_request(box, earlier):
    name = "midwindow-" + earlier.replace(" ", "-")
    key = key_with(box, name, **({"tokens_per_day": 1_000_000} if earlier == "a larger limit" else {}))
    spent = spend(box, key, 3)
    assert spent > 400
    with box.admin() as admin:
        assert admin.put(f"/admin/quotas/key:{key[:12]}", json={"tokens_per_day": 400}).status_code == 200
    with box.client(key) as client:
        refused = client.post("/v1/chat/completions", json=chat_body("one more", max_tokens=4))
    assert refused.status_code == 429, refused.text
    assert f"{spent} used of 400" in refused.json()["error"]["message"]
    assert "over its limit" in refused.json()["error"]["message"]

    day_start = time.time() // DAY * DAY
    counter = quota(box, f"key:{key[:12]}")["usage"]["tokens_per_day"]
    with box.admin() as admin:
        report = admin.get("/admin/usage", params={"since": str(day_start), "key": key[:12]}).json()
    ledger_tokens = sum(row["total_tokens"] for row in report["rows"])
    shown = cli_quota(box, f"key:{key[:12]}", "--json")
    assert shown.returncode == 0, shown.stderr
    cli_counter = json.loads(shown.stdout)["usage"]["tokens_per_day"]
    with console(box) as page:
        badge = table_limit(keys_page(page), f'data-key="{key[:12]}"', "tokens_per_day")
    assert counter["spent"] == ledger_tokens == cli_counter["spent"] == float(badge["spent"]) == spent
    assert counter["state"] == cli_counter["state"] == badge["state"] == "over"
    assert "OVER LIMIT" in cli_quota(box, f"key:{key[:12]}").stdout


def test_a_team_limit_set_mid_window_counts_its_keys_spending(box):
    with box.admin() as admin:
        team = admin.post("/admin/teams", json={"name": "midwindow-team"}).json()
    key = box.create_key("team-member", team_id=team["id"])
    spent = spend(box, key, 2)
    with box.admin() as admin:
        assert admin.put("/admin/quotas/team:midwindow-team", json={"tokens_per_day": spent - 1}).status_code == 200
    with box.client(key) as client:
        refused = client.post("/v1/chat/completions", json=chat_body("one more", max_tokens=4))
    assert refused.status_code == 429, refused.text
    assert "the key's team" in refused.json()["error"]["message"]
    counter = quota(box, "team:midwindow-team")["usage"]["tokens_per_day"]
    with console(box) as page:
        badge = table_limit(keys_page(page), 'data-team="midwindow-team"', "tokens_per_day")
    assert counter["spent"] == float(badge["spent"]) == spent and badge["state"] == counter["state"] == "over"


# -- the refusal's words ------------------------------------------------------------------------------------------------------
def test_a_refusal_by_reservations_in_flight_says_what_is_used_and_what_is_reserved(box, free_key):
    text = words(50, "hold")
    prompt_tokens = prompt_cost(box, free_key, "chat", text)
    held = prompt_tokens + LONG
    key = key_with(box, "reserved-refusal", tokens_per_day=held + 300)
    body = chat_body(text, max_tokens=LONG, logit_bias=NO_EOS, stream=True)
    with box.client(key, timeout=60) as client, client.stream("POST", "/v1/chat/completions", json=body) as running:
        assert running.status_code == 200
        lines = running.iter_lines()
        for line in lines:
            if '"content":"' in line.replace(": ", ":") and '"content":""' not in line.replace(": ", ":"):
                break
        with box.client(key) as other:
            refused = other.post("/v1/chat/completions", json=chat_body(words(400, "big"), max_tokens=4))
    assert refused.status_code == 429, refused.text
    message = refused.json()["error"]["message"]
    assert f"0 used and {held} reserved by requests in flight" in message, message
    assert f"of {held + 300}" in message


# -- embedding inputs in flight -----------------------------------------------------------------------------------------------
def test_an_embeddings_request_past_the_keys_cap_is_refused_before_any_work(box):
    key = key_with(box, "embedder")
    before = last_id(box)
    with box.client(key) as client:
        refused = client.post("/v1/embeddings", json={"model": TINY, "input": [f"text {i}" for i in range(EMBEDDING_CAP + 1)]})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "embedding_inputs_over_cap"
        assert f"{EMBEDDING_CAP + 1} inputs" in error["message"] and f"at most {EMBEDDING_CAP}" in error["message"]
        assert rows_after(box, before) == []  # refused before admission: nothing reserved, nothing in the ledger
        served = client.post("/v1/embeddings", json={"model": TINY, "input": [f"text {i}" for i in range(EMBEDDING_CAP)]})
        assert served.status_code == 200, served.text
        assert len(served.json()["data"]) == EMBEDDING_CAP
        # the same cap through Ollama's embed route, which shares the gateway
        refused = client.post("/api/embed", json={"model": TINY, "input": [f"x{i}" for i in range(EMBEDDING_CAP * 3)]})
        assert refused.status_code == 429, refused.text


def test_concurrent_embeddings_of_one_key_never_pass_its_cap(box):
    """Six requests of five inputs at once under a cap of eight: the ones that overlap are refused, none leaks a hold."""
    import concurrent.futures

    key = key_with(box, "embedder-burst")

    def one(i: int) -> httpx.Response:
        with box.client(key) as client:
            inputs = [words(300, f"e{i}-{j}") for j in range(5)]
            return client.post("/v1/embeddings", json={"model": TINY, "input": inputs})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    for answer in answers:
        assert answer.status_code in (200, 429), answer.text
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "embedding_inputs_in_flight"
            assert answer.headers["retry-after"] == "1"
    with box.client(key) as client:  # every hold was given back
        again = client.post("/v1/embeddings", json={"model": TINY, "input": [f"t{i}" for i in range(EMBEDDING_CAP)]})
        assert again.status_code == 200, again.text


# -- an engine fault after the prefill (last: the engine is killed and restarted) -------------------------------------------
def test_an_engine_killed_after_the_first_token_charges_the_prompt_it_read(box, free_key):
    text = words(500, "crash")
    prompt_tokens = prompt_cost(box, free_key, "chat", text)
    key = key_with(box, "engine-fault", tokens_per_day=10_000_000)
    pid = int(load(box)["pid"])
    before = last_id(box)
    body = chat_body(text, max_tokens=LONG, logit_bias=NO_EOS, stream=True)
    with box.client(key, timeout=120) as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if re.search(r'"content":"[^"]', line.replace(": ", ":")):
                break
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)
    assert any('"engine_unavailable"' in line for line in rest), rest[-3:]
    status, _endpoint, charged_prompt, completion, _key = one_row_after(box, before)
    assert (status, charged_prompt) == (503, prompt_tokens)  # the prefill was done: its tokens are charged
    assert completion >= 1
