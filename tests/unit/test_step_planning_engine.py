"""The step planner on the real batcher (libllama on a tiny GGUF): who is read and admitted first.

Orders are compared, never durations: which request got its first token first,
and how much of a long prompt had been read by then.
"""

from __future__ import annotations

import asyncio

from appliance.drivers.llamacpp.protocol import parse_completion
from appliance.drivers.llamacpp.sequence import Sequence
from appliance.drivers.llamacpp.service import WorkerConfig, WorkerEngine


def run(engine: WorkerEngine, requests: list[tuple[list[int], int, str]]) -> list[Sequence]:
    """Submit ``(prompt ids, max_tokens, class)`` requests back to back; returns their finished sequences."""

    async def serve() -> list[Sequence]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, engine.start, loop)
        seqs = []
        for prompt, max_tokens, priority in requests:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            seq = engine.prepare(parse_completion(body, engine.model.info.n_vocab))
            seq.priority = priority
            seqs.append(seq)
        for seq in seqs:
            engine.batcher.submit(seq)
        for seq in seqs:
            async for _ in seq.events():
                pass
        return seqs

    try:
        return asyncio.run(serve())
    finally:
        engine.close()


def test_a_short_prompt_is_read_beside_a_long_prefill_not_after_it(tiny_gguf):
    engine = WorkerEngine(WorkerConfig(str(tiny_gguf), "tiny", ctx=2048, parallel=2, threads=2, batch_size=32))
    long_doc = [5 + i % 200 for i in range(1500)]  # 47 steps of 32 tokens
    long_seq, chat = run(engine, [(long_doc, 2, "interactive"), ([7, 8, 9, 10], 2, "interactive")])
    assert long_seq.n_gen == 2 and chat.n_gen == 2
    assert chat.t_first < long_seq.t_first
    assert engine.batcher.snapshot()["prompt_tokens_total"] == 1504


def test_interactive_requests_take_a_free_slot_before_batch_ones(tiny_gguf):
    engine = WorkerEngine(WorkerConfig(str(tiny_gguf), "tiny", ctx=512, parallel=1, threads=2))
    running, batch, interactive = run(
        engine,
        [([3, 4, 5], 48, "interactive"), ([6, 7, 8], 4, "batch"), ([9, 10, 11], 4, "interactive")],
    )
    assert running.t_first < interactive.t_first < batch.t_first
    assert batch.n_gen == interactive.n_gen == 4


def test_stats_report_the_prefix_cache_hit_rate(tiny_gguf):
    engine = WorkerEngine(WorkerConfig(str(tiny_gguf), "tiny", ctx=512, parallel=1, threads=2))
    shared = [20 + i for i in range(100)]
    first, second = run(engine, [(shared, 1, "interactive"), ([*shared, 7, 7], 1, "interactive")])
    stats = engine.batcher.snapshot()
    assert second.cached == 100  # the whole first prompt was reused
    assert stats["prompt_tokens_total"] == 202
    assert stats["prefix_cache_hit_rate"] == round((first.cached + 100) / 202, 4)
