"""Greedy sequences pick their tokens with numpy's argmax; the tokens are libllama's greedy sampler's.

Each request is generated twice on a real tiny model: once on the argmax path and
once with it switched off (the sampler chain inside libllama), token for token
equal, with logit bias, ``ignore_eos`` and chat's first-token ban on the way.
"""

from __future__ import annotations

import asyncio

import pytest

from appliance.drivers.llamacpp.protocol import parse_chat, parse_completion
from appliance.drivers.llamacpp.sequence import Sequence
from appliance.drivers.llamacpp.service import WorkerConfig, WorkerEngine


@pytest.fixture
def engine(tiny_gguf):
    e = WorkerEngine(WorkerConfig(str(tiny_gguf), "tiny", ctx=256, parallel=2, threads=1))
    yield e
    e.close()


def generate(engine: WorkerEngine, *seqs: Sequence) -> list[str]:
    """Each sequence's text, generated one after the other on one running batcher."""

    async def run() -> list[str]:
        engine.start(asyncio.get_running_loop())
        out = []
        for seq in seqs:
            engine.batcher.submit(seq)
            out.append("".join([text async for text, _ in seq.events()]))
        return out

    return asyncio.run(run())


REQUESTS = [
    ("completion", {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}),
    ("completion", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logit_bias": {"7": 50.0, "17": -100}}),
    ("completion", {"prompt": "A B C D", "max_tokens": 32, "temperature": 0, "ignore_eos": True}),
    ("chat", {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 24, "temperature": 0}),
]


@pytest.mark.parametrize(("kind", "body"), REQUESTS)
def test_the_argmax_path_picks_the_tokens_libllamas_greedy_sampler_picks(engine, kind, body):
    parse = parse_chat if kind == "chat" else parse_completion
    fast = engine.prepare(parse(body, engine.model.info.n_vocab))
    assert fast.argmax
    slow = engine.prepare(parse(body, engine.model.info.n_vocab))
    slow.argmax = False
    fast_text, slow_text = generate(engine, fast, slow)
    assert fast_text == slow_text
    assert fast.n_gen == slow.n_gen > 0


def test_sampling_with_temperature_penalties_or_grammar_stays_in_libllama(engine):
    n_vocab = engine.model.info.n_vocab
    for body in (
        {"prompt": "x", "temperature": 0.7},
        {"prompt": "x", "temperature": 0, "frequency_penalty": 0.5},
        {"prompt": "x", "temperature": 0, "response_format": {"type": "json_object"}},
    ):
        seq = engine.prepare(parse_completion(body, n_vocab))
        assert not seq.argmax, body
        seq.free_samplers()
