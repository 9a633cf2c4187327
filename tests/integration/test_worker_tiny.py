"""The llama.cpp worker as a real subprocess on a Unix socket, with the tiny model.

Fast: the tiny random-weight GGUF loads in milliseconds. Outputs are gibberish
but deterministic, which is all these contract tests need.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import pytest

from tests.ggufkit import WorkerProcess, make_tiny_gguf

NO_EOS = {"2": -100}  # the tiny model's </s>: force exact lengths


@pytest.fixture(scope="module")
def worker(tiny_gguf, tmp_path_factory):
    sock = tmp_path_factory.mktemp("wt") / "w.sock"
    with WorkerProcess(tiny_gguf, sock, served_name="tiny", ctx=256, parallel=8, threads=1) as w:
        yield w


def sse_events(raw: str) -> list:
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[6:]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_health_models_stats(worker):
    async with worker.client() as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
        stats = (await c.get("/stats")).json()
        for k in (
            "slots_total",
            "slots_busy",
            "waiting",
            "kv_cells_used",
            "tokens_generated_total",
            "prompt_tokens_total",
            "cached_tokens_total",
        ):
            assert isinstance(stats[k], int)
        assert stats["slots_total"] == 8


def test_socket_is_private(worker):
    import os
    import stat

    assert stat.S_IMODE(os.stat(worker.socket).st_mode) == 0o600


async def test_completion_shape_and_usage(worker):
    async with worker.client() as c:
        r = await c.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "hello world", "max_tokens": 7, "temperature": 0, "logit_bias": NO_EOS},
        )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"]
    ch = body["choices"][0]
    assert ch["index"] == 0 and ch["finish_reason"] == "length" and ch["logprobs"] is None
    assert isinstance(ch["text"], str)
    u = body["usage"]
    assert u["completion_tokens"] == 7 and u["total_tokens"] == u["prompt_tokens"] + 7
    assert "cached_tokens" in u["prompt_tokens_details"]


async def test_stream_equals_non_stream_and_usage_chunk(worker):
    req = {"prompt": "the model answer", "max_tokens": 12, "temperature": 0, "logit_bias": NO_EOS}
    async with worker.client() as c:
        plain = (await c.post("/v1/completions", json=req)).json()
        r = await c.post("/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.text)
    assert ev[-1] == "[DONE]"
    usage = ev[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    chunks = ev[:-2]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["text"] for e in chunks)
    assert text == plain["choices"][0]["text"]


async def test_chat_stream_shape(worker):
    async with worker.client() as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True, "seed": 1},
        )
    ev = sse_events(r.text)
    assert ev[0]["object"] == "chat.completion.chunk"
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant"
    assert ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "usage" not in ev[-2] or ev[-2]["choices"]


async def test_greedy_identical_alone_and_in_a_crowd(worker):
    """Batching must not change results: same greedy output alone and beside 7 others
    (f32 weights: llama.cpp's results are exact across batch compositions)."""
    req = {"prompt": "one two three", "max_tokens": 24, "temperature": 0, "logit_bias": NO_EOS}
    async with worker.client() as c:
        alone = (await c.post("/v1/completions", json=req)).json()["choices"][0]["text"]
        others = [
            {"prompt": p, "max_tokens": 30, "temperature": 0.9, "seed": i, "logit_bias": NO_EOS}
            for i, p in enumerate(
                ["water time", "long day", "people work", "one two three four", "first call", "new line " * 30, "back"]
            )
        ]
        results = await asyncio.gather(c.post("/v1/completions", json=req), *(c.post("/v1/completions", json=o) for o in others))
    assert results[0].json()["choices"][0]["text"] == alone


async def test_seeded_sampling_is_reproducible(worker):
    req = {"prompt": "hello", "max_tokens": 16, "temperature": 1.0, "seed": 42, "logit_bias": NO_EOS}
    async with worker.client() as c:
        a = (await c.post("/v1/completions", json=req)).json()["choices"][0]["text"]
        b = (await c.post("/v1/completions", json=req)).json()["choices"][0]["text"]
    assert a == b


async def test_logit_bias_forces_a_token(worker):
    # token 300 is a normal word piece in the tiny vocabulary
    async with worker.client() as c:
        r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "temperature": 0, "logit_bias": {"300": 100}})
        piece = (await c.post("/v1/completions", json={"prompt": [300], "max_tokens": 0})).json()
    text = r.json()["choices"][0]["text"]
    assert len(text) > 0 and text == text[: len(text) // 3] * 3
    assert piece["choices"][0]["finish_reason"] == "length"
    assert piece["choices"][0]["text"] == "" and piece["usage"]["completion_tokens"] == 0


async def test_errors_are_openai_shaped(worker):
    async with worker.client() as c:
        cases = [
            (await c.post("/v1/completions", json={"prompt": "x", "n": 2}), 400, "n"),
            (await c.post("/v1/completions", content=b"{not json"), 400, None),
            (await c.post("/v1/completions", json={"prompt": "word " * 400}), 400, "prompt"),
            (await c.get("/v1/nothing"), 404, None),
            (await c.get("/v1/completions"), 405, None),
        ]
    for r, status, param in cases:
        assert r.status_code == status
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        if param:
            assert err["param"] == param
    assert cases[2][0].json()["error"]["code"] == "context_length_exceeded"


async def test_stop_string_cuts_output(worker):
    req = {"prompt": "hello world", "max_tokens": 20, "temperature": 0, "logit_bias": NO_EOS}
    async with worker.client() as c:
        full = (await c.post("/v1/completions", json=req)).json()["choices"][0]["text"]
        stop = full[5:8]
        assert stop.strip()
        cut = (await c.post("/v1/completions", json={**req, "stop": [stop]})).json()
        streamed = sse_events((await c.post("/v1/completions", json={**req, "stop": stop, "stream": True})).text)
    expected = full[: full.index(stop)]
    assert cut["choices"][0]["text"] == expected and cut["choices"][0]["finish_reason"] == "stop"
    text = "".join(e["choices"][0]["text"] for e in streamed[:-1])
    assert text == expected and streamed[-2]["choices"][0]["finish_reason"] == "stop"


async def test_cancel_frees_the_slot(worker):
    async with worker.client() as c:
        async with c.stream(
            "POST", "/v1/completions", json={"prompt": "hello", "max_tokens": 200, "stream": True, "logit_bias": NO_EOS}
        ) as r:
            n = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    n += 1
                    if n == 3:
                        break
        for _ in range(100):
            stats = (await c.get("/stats")).json()
            if stats["slots_busy"] == 0:
                break
            await asyncio.sleep(0.02)
    assert stats["slots_busy"] == 0


async def test_embeddings_shape_and_norm(worker):
    async with worker.client() as c:
        r = await c.post("/v1/embeddings", json={"input": ["hello world", "the model"], "model": "tiny"})
        one = await c.post("/v1/embeddings", json={"input": "hello world"})
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 2 and body["usage"]["prompt_tokens"] > 0
    for i, d in enumerate(body["data"]):
        assert d["index"] == i and d["object"] == "embedding" and len(d["embedding"]) == 64
        assert math.isclose(math.sqrt(sum(x * x for x in d["embedding"])), 1.0, rel_tol=1e-4)
    assert one.json()["data"][0]["embedding"] == pytest.approx(body["data"][0]["embedding"], abs=1e-5)


async def test_json_mode_grammar(worker):
    async with worker.client() as c:
        r = await c.post(
            "/v1/completions",
            json={
                "prompt": "json",
                "max_tokens": 60,
                "temperature": 0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
                },
            },
        )
    # the random model's free choice is nearly always invalid: this exercises the
    # full-vocabulary resample path of the grammar check
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop"
    assert isinstance(json.loads(ch["text"])["a"], int)


async def test_json_object_with_penalties_uses_the_in_chain_grammar(worker):
    async with worker.client() as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "json"}],
                "max_tokens": 40,
                "temperature": 0.7,
                "seed": 1,
                "repeat_penalty": 1.1,
                "response_format": {"type": "json_object"},
            },
        )
    text = r.json()["choices"][0]["message"]["content"]
    assert text.startswith("{")


def test_malicious_chat_template_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = "{{ lipsum.__globals__['os'].popen('touch " + str(marker) + "').read() }}"
    model = make_tiny_gguf(tmp_path / "evil.gguf", chat_template=evil)
    with WorkerProcess(model, tmp_path / "e.sock", ctx=128, parallel=1) as w, w.sync_client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert c.get("/health").status_code == 200
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "chat_template_error"
    assert not marker.exists()


def test_unloadable_model_exits_nonzero_with_message(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance.drivers.llamacpp.worker",
            "--model",
            str(bad),
            "--socket",
            str(tmp_path / "b.sock"),
            "--served-name",
            "x",
            "--ctx",
            "64",
            "--parallel",
            "1",
            "--threads",
            "1",
            "--n-gpu-layers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "cannot load the model" in p.stderr
    assert not (tmp_path / "b.sock").exists()


def test_speculative_prompt_lookup_keeps_greedy_output(tiny_gguf, tmp_path, worker):
    """Drafts from n-gram lookup are verified by the model: output is unchanged
    (up to attention rounding, see below) and accepted drafts are counted."""
    prompt = "one two three four one two three four one two three four one two"
    req = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "logit_bias": NO_EOS}
    with worker.sync_client() as c:
        plain = c.post("/v1/completions", json=req).json()["choices"][0]["text"]
    with (
        WorkerProcess(tiny_gguf, tmp_path / "s.sock", ctx=256, parallel=2, extra=("--spec-ngram", "2")) as w,
        w.sync_client() as c,
    ):
        spec = c.post("/v1/completions", json=req).json()
        streamed = sse_events(c.post("/v1/completions", json={**req, "stream": True}).text)
        # a forced token repeats, so drafts are accepted: the accept path is exercised too
        forced = {**req, "logit_bias": {"2": -100, "300": 12}, "max_tokens": 30}
        spec_forced = c.post("/v1/completions", json=forced).json()
        stats = c.get("/stats").json()
    with worker.sync_client() as c:
        plain_forced = c.post("/v1/completions", json=forced).json()

    # Rejected drafts leave holes in the KV cells, so attention sums in another
    # order (f16 accumulation in llama.cpp's CPU flash attention): the random
    # model's near-ties may flip late. Require the long common opening.
    def opening(a: str, b: str) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    assert opening(spec["choices"][0]["text"], plain) >= len(plain) // 3
    assert spec["usage"]["completion_tokens"] == 40
    assert opening("".join(e["choices"][0]["text"] for e in streamed[:-1]), plain) >= len(plain) // 3
    assert opening(spec_forced["choices"][0]["text"], plain_forced["choices"][0]["text"]) >= 10
    assert spec_forced["usage"]["completion_tokens"] == 30
    assert stats["spec_drafted_total"] > 0 and stats["spec_accepted_total"] > 0


def test_embedding_mode(tiny_gguf, tmp_path):
    with WorkerProcess(tiny_gguf, tmp_path / "e.sock", ctx=128, parallel=2, extra=("--embedding",)) as w, w.sync_client() as c:
        emb = c.post("/v1/embeddings", json={"input": [[5, 6, 7], "hello"], "encoding_format": "base64"})
        gen = c.post("/v1/completions", json={"prompt": "x"})
    assert emb.status_code == 200 and len(emb.json()["data"]) == 2
    assert isinstance(emb.json()["data"][0]["embedding"], str)  # base64 float32
    assert gen.status_code == 400


async def test_prefix_cache_idle_slot_and_busy_donor(worker):
    prefix = "the people of the water time " * 5
    async with worker.client() as c:
        first = await c.post("/v1/completions", json={"prompt": prefix + "one", "max_tokens": 2, "temperature": 0})
        again = await c.post("/v1/completions", json={"prompt": prefix + "two", "max_tokens": 2, "temperature": 0})
        n_prefix = first.json()["usage"]["prompt_tokens"] - 2
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_prefix - 1
        # a busy slot lends its KV to a new request with the same prefix (llama_memory_seq_cp)
        donor_prefix = "long day back work " * 6

        async def slow():
            return await c.post(
                "/v1/completions", json={"prompt": donor_prefix + "a", "max_tokens": 190, "temperature": 0, "logit_bias": NO_EOS}
            )

        busy = asyncio.create_task(slow())
        for _ in range(200):
            if (await c.get("/stats")).json()["slots_busy"]:
                break
            await asyncio.sleep(0.005)
        borrower = await c.post(
            "/v1/completions", json={"prompt": donor_prefix + "b", "max_tokens": 4, "temperature": 0, "logit_bias": NO_EOS}
        )
        donor_still_busy = not busy.done()
        alone_ref = (await busy).json()
    assert donor_still_busy, "the donor finished too early to test sharing from a busy slot"
    cached = borrower.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= alone_ref["usage"]["prompt_tokens"] - 3
