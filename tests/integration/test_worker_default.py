"""The llama.cpp worker with the real default model (Gemma 3 270M base, Q4_K_M).

One worker (8 slots) serves the whole module. Marked slow: about a minute on
two cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid

import pytest

from tests.ggufkit import WorkerProcess

pytestmark = pytest.mark.slow

PROMPTS = [
    "A recipe for bread begins with",
    "The history of the printing press",
    "In the year 2050, cities",
    "The rules of chess are",
    "Photosynthesis is the process",
    "The best way to learn a language",
    "Once upon a time in a small village",
    "The theory of relativity says",
]
NO_EOG = {"1": -100, "106": -100}  # <eos>, <end_of_turn>


@pytest.fixture(scope="module")
def worker(default_gguf, tmp_path_factory):
    sock = tmp_path_factory.mktemp("wd") / "w.sock"
    with WorkerProcess(default_gguf, sock, served_name="gemma", ctx=1024, parallel=8, threads=2) as w:
        yield w


async def complete(c, **body) -> dict:
    r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def stream(c, path="/v1/completions", **body) -> tuple[list[str], dict, str, float]:
    """Return (text pieces, usage, finish_reason, time to first text)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    pieces, usage, finish, ttft = [], None, None, None
    t0 = time.perf_counter()
    async with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj["choices"]:
                text = ch.get("text", ch.get("delta", {}).get("content")) or ""
                if text:
                    ttft = ttft or time.perf_counter() - t0
                    pieces.append(text)
                finish = ch["finish_reason"] or finish
    return pieces, usage, finish, ttft


async def test_greedy_alone_vs_beside_seven_others(worker):
    """Continuous batching must not mix sequences.

    Exact equality is asserted on the tiny f32 model (test_worker_tiny). With
    Q4_K weights llama.cpp's CPU kernels round differently for different
    ubatch sizes (the raw low-level loop shows the same: logits move by up to
    ~0.7), so a greedy near-tie can flip a token, once seen as early as the
    second ("Once upon a time in a small village, a family…" alone, "…, a
    young man…" in the crowd), and 4 of 8 outputs have been seen to drift
    somewhere in 16 tokens. A mixing bug (one sequence reading another's KV or
    logits) makes an output continue a different prompt; so each crowd output
    must begin with its own alone-run's first word and share a longer prefix
    with it than with any other prompt's alone-run.
    """
    async with worker.client() as c:
        alone = [(await complete(c, prompt=p, max_tokens=16, temperature=0))["choices"][0]["text"] for p in PROMPTS]
        crowd = await asyncio.gather(*(complete(c, prompt=p, max_tokens=16, temperature=0) for p in PROMPTS))
    crowd_texts = [r["choices"][0]["text"] for r in crowd]
    assert len(set(alone)) == len(PROMPTS), alone  # the prompts' continuations tell them apart
    for i, text in enumerate(crowd_texts):
        assert text.split()[:1] == alone[i].split()[:1], (PROMPTS[i], alone[i], text)
        own = common_prefix(text, alone[i])
        others = max(common_prefix(text, a) for j, a in enumerate(alone) if j != i)
        assert own > others, (PROMPTS[i], alone[i], text)
    assert sum(a == b for a, b in zip(alone, crowd_texts, strict=True)) >= 1, list(zip(alone, crowd_texts, strict=True))


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def test_stream_equals_non_stream(worker):
    async with worker.client() as c:
        plain = await complete(c, prompt=PROMPTS[1], max_tokens=48, temperature=0)
        pieces, usage, finish, _ = await stream(c, prompt=PROMPTS[1], max_tokens=48, temperature=0)
    assert "".join(pieces) == plain["choices"][0]["text"]
    assert finish == plain["choices"][0]["finish_reason"]
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"]


async def test_stop_string_spanning_tokens(worker):
    async with worker.client() as c:
        pieces, _, _, _ = await stream(c, prompt=PROMPTS[6], max_tokens=40, temperature=0, logit_bias=NO_EOG)
        # a stop string made of the end of one token and the start of the next
        i = next(i for i in range(2, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
        stop = pieces[i][-2:] + pieces[i + 1][:2]
        full = "".join(pieces)
        expected = full[: full.index(stop)]
        res = await complete(c, prompt=PROMPTS[6], max_tokens=40, temperature=0, logit_bias=NO_EOG, stop=[stop])
        spieces, _, sfinish, _ = await stream(c, prompt=PROMPTS[6], max_tokens=40, temperature=0, logit_bias=NO_EOG, stop=stop)
    assert res["choices"][0]["text"] == expected and res["choices"][0]["finish_reason"] == "stop"
    assert "".join(spieces) == expected and sfinish == "stop"
    assert not any(stop[:3] in p for p in spieces[-2:])


async def test_max_tokens_gives_length(worker):
    async with worker.client() as c:
        r = await complete(c, prompt=PROMPTS[3], max_tokens=5, temperature=0, logit_bias=NO_EOG)
        r2 = await complete(c, prompt=PROMPTS[3], max_completion_tokens=3, temperature=0, logit_bias=NO_EOG)
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 5
    assert r2["usage"]["completion_tokens"] == 3


async def test_prefix_cache_reuses_kv_and_cuts_ttft(worker):
    prefix = f"Document {uuid.uuid4().hex}. " + " ".join(
        f"Paragraph {i}: the committee reviewed budget line {i * 7} and approved it after a long debate." for i in range(22)
    )
    async with worker.client() as c:
        _, cold_usage, _, cold = await stream(c, prompt=prefix + "\nSummary:", max_tokens=4, temperature=0)
        _, warm_usage, _, warm = await stream(
            c, prompt=prefix + "\nQuestion: what was approved?\nAnswer:", max_tokens=4, temperature=0
        )
    assert cold_usage["prompt_tokens"] > 300
    assert cold_usage["prompt_tokens_details"]["cached_tokens"] <= 2
    assert warm_usage["prompt_tokens_details"]["cached_tokens"] >= cold_usage["prompt_tokens"] - 5
    assert warm < cold * 0.5, (cold, warm)


async def test_json_schema_output_parses(worker):
    schema = {"type": "object", "properties": {"year": {"type": "integer"}}, "required": ["year"]}
    async with worker.client() as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "In which year did the Berlin wall fall? Answer in JSON."}],
                "max_tokens": 40,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "y", "schema": schema}},
            },
        )
    msg = r.json()["choices"][0]
    assert msg["finish_reason"] == "stop"
    assert isinstance(json.loads(msg["message"]["content"])["year"], int)


async def test_chat_answer_is_not_empty(worker):
    async with worker.client() as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 30,
                "temperature": 0,
            },
        )
        pieces, usage, finish, _ = await stream(
            c, "/v1/chat/completions", max_tokens=30, temperature=0, messages=[{"role": "user", "content": "Name a color."}]
        )
    text = r.json()["choices"][0]["message"]["content"]
    assert text.strip() and "Paris" in text
    assert "".join(pieces).strip() and usage["completion_tokens"] > 0 and finish in ("stop", "length")


async def test_cancel_frees_slot_within_a_step(worker):
    async with worker.client() as c:
        async with c.stream(
            "POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 500, "stream": True, "logit_bias": NO_EOG}
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
        busy = None
        for _ in range(50):
            busy = (await c.get("/stats")).json()["slots_busy"]
            if busy == 0:
                break
            await asyncio.sleep(0.02)
    assert busy == 0


async def test_embeddings(worker):
    async with worker.client() as c:
        r = await c.post("/v1/embeddings", json={"input": ["The cat sat on the mat.", "A dog barked.", "Stocks fell."]})
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    for d in data:
        assert len(d["embedding"]) == 640
        assert math.isclose(math.sqrt(sum(x * x for x in d["embedding"])), 1.0, rel_tol=1e-4)
