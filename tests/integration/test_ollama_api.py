"""The official `ollama` client against the real daemon and the real llama.cpp engine (Ollama API under /api)."""

import json
import sqlite3
import time

import httpx
import ollama
import pytest

from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import wait_until
from tests.storekit import RangeServer

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _client(daemon, key: str) -> ollama.Client:
    return ollama.Client(host=daemon.url, headers={"Authorization": f"Bearer {key}"}, timeout=300)


@pytest.fixture(scope="module")
def key_name():
    return "ollama-ledger"


@pytest.fixture(scope="module")
def key(daemon, key_name):
    return daemon.create_key(key_name)


@pytest.fixture(scope="module")
def client(daemon, key):
    return _client(daemon, key)


def _ledger(daemon, key_name: str) -> list[tuple]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        return db.execute(
            "SELECT u.endpoint, u.model, u.prompt_tokens, u.completion_tokens, u.status FROM usage u "
            "JOIN api_keys k ON k.id = u.key_id WHERE k.name = ? ORDER BY u.id",
            (key_name,),
        ).fetchall()


def test_version(client):
    assert client._client.get("/api/version").json()["version"]  # the client has no method for it


def test_list_shows_the_installed_model_and_the_alias(client):
    models = {m.model: m for m in client.list().models}
    assert "gemma-3-270m:q4_k_m" in models and "default" in models
    entry = models["gemma-3-270m:q4_k_m"]
    assert entry.size > 100_000_000 and entry.digest
    assert entry.details.format == "gguf" and entry.details.family == "gemma3"
    assert entry.details.quantization_level == "Q4_K_M" and entry.details.parameter_size.endswith("M")


def test_list_is_filtered_by_the_key_allow_list(daemon):
    limited = _client(daemon, daemon.create_key("ollama-limited", allowed_models=["other-family:q8_0"]))
    assert limited.list().models == []
    with pytest.raises(ollama.ResponseError) as info:
        limited.show("default")
    assert info.value.status_code == 403


def test_show(client):
    shown = client.show("default")
    assert shown.details.family == "gemma3"
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["gemma3.context_length"] > 0
    assert "completion" in shown.capabilities and "embedding" in shown.capabilities


def test_chat_streamed_and_plain_agree(client):
    options = {"temperature": 0, "seed": 1, "num_predict": 24}
    messages = [{"role": "user", "content": "Describe the sea in one sentence."}]
    parts = list(client.chat(model="default", messages=messages, options=options, stream=True))
    assert len(parts) > 2 and [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    final = parts[-1]
    assert final.done_reason in ("stop", "length") and final.prompt_eval_count > 0 and 0 < final.eval_count <= 24
    assert final.total_duration >= final.prompt_eval_duration > 0 and final.eval_duration > 0

    plain = client.chat(model="default", messages=messages, options=options)
    assert plain.done and plain.message.role == "assistant"
    assert plain.message.content == "".join(p.message.content for p in parts) != ""
    assert (plain.prompt_eval_count, plain.eval_count) == (final.prompt_eval_count, final.eval_count)
    assert plain.total_duration > 0 and plain.eval_duration > 0


def test_ps_lists_the_loaded_model(client):
    client.chat(model="default", messages=QUESTION, options={"num_predict": 1})
    loaded = {m.model: m for m in client.ps().models}
    assert "gemma-3-270m:q4_k_m" in loaded
    assert loaded["gemma-3-270m:q4_k_m"].size > 0 and loaded["gemma-3-270m:q4_k_m"].details.family == "gemma3"


def test_num_predict_caps_eval_count(client):
    reply = client.generate(
        model="default", prompt="Count from one to fifty: one, two, three,", options={"num_predict": 5, "temperature": 0}
    )
    assert reply.eval_count == 5 and reply.done_reason == "length"


def test_generate_streamed_and_plain_agree(client):
    options = {"num_predict": 12, "temperature": 0}
    parts = list(
        client.generate(model="default", prompt="Name three colours.", system="Answer briefly.", stream=True, options=options)
    )
    assert len(parts) > 2 and parts[-1].done and parts[-1].eval_count > 0
    plain = client.generate(model="default", prompt="Name three colours.", system="Answer briefly.", options=options)
    assert plain.response == "".join(p.response for p in parts) != ""


def test_generate_streamed_and_raw(client):
    parts = list(
        client.generate(
            model="default",
            prompt="The capital of France is",
            raw=True,
            stream=True,
            options={"num_predict": 8, "temperature": 0},
        )
    )
    assert parts[-1].done and parts[-1].eval_count > 0
    text = "".join(p.response for p in parts)
    plain = client.generate(
        model="default", prompt="The capital of France is", raw=True, options={"num_predict": 8, "temperature": 0}
    )
    assert text == plain.response and text.strip()


def test_format_json_gives_parseable_json(client):
    reply = client.chat(
        model="default",
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        format={"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]},
        options={"temperature": 0, "num_predict": 60},
    )
    assert isinstance(json.loads(reply.message.content)["capital"], str)
    reply = client.generate(
        model="default", prompt="A JSON object with a name:", format="json", options={"temperature": 0, "num_predict": 60}
    )
    assert isinstance(json.loads(reply.response), dict)


def test_embed_and_legacy_embeddings(client):
    result = client.embed(model="default", input=["hello world", "goodbye"])
    assert len(result.embeddings) == 2 and len(result.embeddings[0]) > 10 and result.prompt_eval_count > 0
    single = client.embeddings(model="default", prompt="hello world")
    assert single.embedding == pytest.approx(list(result.embeddings[0]), abs=1e-4)


def test_usage_rows_carry_the_key_and_tokens(daemon, key_name, client):
    before = len(_ledger(daemon, key_name))
    reply = client.chat(
        model="default", messages=[{"role": "user", "content": "Name a fruit."}], options={"num_predict": 6, "seed": 3}
    )
    parts = list(client.generate(model="default", prompt="Name a river.", stream=True, options={"num_predict": 6, "seed": 3}))
    rows = _ledger(daemon, key_name)[before:]
    assert rows == [
        ("chat", "gemma-3-270m:q4_k_m", reply.prompt_eval_count, reply.eval_count, 200),
        ("chat", "gemma-3-270m:q4_k_m", parts[-1].prompt_eval_count, parts[-1].eval_count, 200),
    ]


def test_unknown_model_is_404_in_ollama_shape(client, daemon, key):
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="no-such-model", messages=QUESTION)
    assert info.value.status_code == 404 and "no-such-model" in info.value.error
    raw = httpx.post(daemon.url + "/api/show", json={"model": "no-such-model"}, headers={"Authorization": f"Bearer {key}"})
    assert raw.status_code == 404 and set(raw.json()) == {"error"}


def test_refused_field_is_400_naming_it(client):
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="default", prompt="hi", template="{{ .Prompt }}")
    assert info.value.status_code == 400 and "template" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="default", messages=QUESTION, options={"mirostat": 2})
    assert info.value.status_code == 400 and "options.mirostat" in info.value.error


def test_missing_key_is_401(daemon):
    keyless = ollama.Client(host=daemon.url, timeout=30)
    with pytest.raises(ollama.ResponseError) as info:
        keyless.list()
    assert info.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as info:
        keyless.chat(model="default", messages=QUESTION)
    assert info.value.status_code == 401


def test_pull_and_delete_need_an_admin_key(client):
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("gemma-3-270m:q8_0")
    assert info.value.status_code == 403
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("gemma-3-270m:q4_k_m")
    assert info.value.status_code == 403
    assert "gemma-3-270m:q4_k_m" in {m.model for m in client.list().models}


def test_admin_delete_of_a_loaded_model_is_refused_and_unknown_is_404(daemon, admin_key):
    admin = _client(daemon, admin_key)
    admin.chat(model="default", messages=QUESTION, options={"num_predict": 1})
    with pytest.raises(ollama.ResponseError) as info:
        admin.delete("gemma-3-270m:q4_k_m")
    assert info.value.status_code == 409
    with pytest.raises(ollama.ResponseError) as info:
        admin.delete("no-such:model")
    assert info.value.status_code == 404


def test_hang_up_mid_stream_is_settled_at_once(daemon, key):
    body = {
        "model": "default",
        "prompt": "Once upon a time, in a small village by the sea,",
        "raw": True,
        "options": {"num_predict": 400, "temperature": 0},
    }
    with (
        httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as http,
        http.stream("POST", "/api/generate", json=body) as response,
    ):
        assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
        request_id = response.headers["x-request-id"]
        lines = response.iter_lines()
        pieces = [json.loads(next(lines)) for _ in range(10)]
        assert not any(p["done"] for p in pieces)
    gone_at = time.monotonic()
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        rows = wait_until(
            lambda: db.execute("SELECT status, completion_tokens FROM usage WHERE request_id = ?", (request_id,)).fetchall(),
            2.0,
            0.05,
            "the usage row of the abandoned stream",
        )
    assert time.monotonic() - gone_at < 2.0
    ((status, completion_tokens),) = rows
    assert status == 499 and 10 <= completion_tokens < 400


@pytest.fixture(scope="module")
def pull_box(tmp_path_factory):
    running = start_daemon(tmp_path_factory.mktemp("ollama-pull"), APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]')
    yield running
    running.stop()


def test_admin_pull_streams_progress_then_delete_removes_it(pull_box, tmp_path):
    admin = _client(pull_box, pull_box.create_key("ollama-admin", role="admin"))
    with RangeServer() as server:
        streamed_url = server.add("Tiny-Q8_0.gguf", make_tiny_gguf(tmp_path / "a.gguf", vocab=4096, n_embd=128))
        plain_url = server.add("Other-Q4_0.gguf", make_tiny_gguf(tmp_path / "b.gguf"))
        progress = list(admin.pull(streamed_url, stream=True))
        assert progress[-1].status == "success"
        assert any(p.total and p.completed for p in progress)
        assert admin.pull(plain_url).status == "success"
    installed = {m.model for m in admin.list().models}
    assert {"tiny:q8_0", "other:q4_0"} <= installed
    with pytest.raises(ollama.ResponseError) as info:
        admin.pull("https://example.invalid/missing-file.gguf")
    assert info.value.status_code >= 400
    assert admin.delete("other:q4_0").status == "success"
    assert "other:q4_0" not in {m.model for m in admin.list().models}
