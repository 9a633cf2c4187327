"""Every sampling option builds a working libllama sampler chain."""

from __future__ import annotations

import pytest

from appliance.drivers.llamacpp.errors import GrammarError
from appliance.drivers.llamacpp.grammar import grammar_for
from appliance.drivers.llamacpp.model import LoadedModel
from appliance.drivers.llamacpp.sampling import (
    SamplingParams,
    build_chain,
    build_grammar,
    drop_first_link,
    free_chain,
)


@pytest.fixture(scope="module")
def model(tiny_gguf):
    m = LoadedModel(str(tiny_gguf))
    yield m
    m.close()


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, seed=7),
    SamplingParams(repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.3),
    SamplingParams(temperature=0, logit_bias={5: -100.0, 6: 3.0}),
    SamplingParams(grammar=grammar_for({"type": "json_object"})),
])
def test_chain_builds(model, params):
    chain = build_chain(model.vocab, model.info.n_vocab, params, ban_first=[2])
    drop_first_link(chain)
    free_chain(chain)


def test_bad_grammar_is_reported(model):
    with pytest.raises(GrammarError):
        build_grammar(model.vocab, "root ::= (")
    with pytest.raises(GrammarError):
        build_chain(model.vocab, model.info.n_vocab, SamplingParams(grammar="root ::= ("))


def test_model_metadata_and_tokenizer(model):
    info = model.info
    assert info.n_vocab == 512 and info.n_embd == 64 and info.bos == 1 and info.eos == 2
    assert model.is_eog(2) and not model.is_eog(300)
    assert model.single_token("</s>") == 2
    assert model.detokenize(model.tokenize("hello world", add_special=False)).strip() == "hello world"
