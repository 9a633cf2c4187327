"""Every sampling option builds a working libllama sampler chain."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as ll
import pytest

from appliance.drivers.llamacpp.grammar import grammar_for
from appliance.drivers.llamacpp.model import LoadedModel
from appliance.drivers.llamacpp.sampling import (
    SamplingParams,
    build_chain,
    drop_first_link,
    free_chain,
)


@pytest.fixture(scope="module")
def model(tiny_gguf):
    m = LoadedModel(str(tiny_gguf))
    yield m
    m.close()


def links(chain) -> list[str]:
    """The names of a chain's samplers, in order (libllama marks a no-op link with a leading ``?``)."""
    return [
        ll.llama_sampler_name(ll.llama_sampler_chain_get(chain, i)).decode().lstrip("?")
        for i in range(ll.llama_sampler_chain_n(chain))
    ]


def pick(chain, logits: list[float]) -> int:
    """The token a chain selects from one row of logits."""
    data = (ll.llama_token_data * len(logits))(*(ll.llama_token_data(i, x, 0.0) for i, x in enumerate(logits)))
    row = ll.llama_token_data_array(data=data, size=len(logits), selected=-1, sorted=False)
    ll.llama_sampler_apply(chain, ctypes.byref(row))
    return data[row.selected].id


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(), ["top-k", "min-p", "temp", "dist"]),
        (SamplingParams(temperature=0), ["greedy"]),
        (SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, seed=7), ["top-p", "temp", "dist"]),
        (
            SamplingParams(repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.3),
            ["penalties", "top-k", "min-p", "temp", "dist"],
        ),
        (SamplingParams(temperature=0, logit_bias={5: -100.0, 6: 3.0}), ["logit-bias", "greedy"]),
        # a grammar is applied to the logits row by llguidance before the chain runs: no link of its own
        (SamplingParams(grammar=grammar_for({"type": "json_object"})), ["top-k", "min-p", "temp", "dist"]),
    ],
)
def test_chain_builds(model, params, expected):
    chain = build_chain(model.vocab, model.info.n_vocab, params, ban_first=[2])
    assert links(chain) == ["logit-bias", *expected]  # the one-token ban comes first
    drop_first_link(chain)
    assert links(chain) == expected
    free_chain(chain)


def test_first_token_ban_and_logit_bias_decide_the_greedy_pick(model):
    logits = [0.0] * model.info.n_vocab
    logits[2], logits[5], logits[7] = 10.0, 9.0, 2.0
    chain = build_chain(
        model.vocab, model.info.n_vocab, SamplingParams(temperature=0, logit_bias={5: -100.0, 6: 3.0}), ban_first=[2]
    )
    assert pick(chain, logits) == 6  # 2 is banned for the first token, 5 biased away, 6 lifted above 7
    drop_first_link(chain)
    assert pick(chain, logits) == 2
    free_chain(chain)


def test_model_metadata_and_tokenizer(model):
    info = model.info
    assert info.n_vocab == 512 and info.n_embd == 64 and info.bos == 1 and info.eos == 2
    assert model.is_eog(2) and not model.is_eog(300)
    assert model.single_token("</s>") == 2
    assert model.detokenize(model.tokenize("hello world", add_special=False)).strip() == "hello world"
