"""The semantic tier with the real embedding model (all-MiniLM-L6-v2 GGUF, served by llama.cpp in-process)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from appliance.cache.embedder import DEFAULT_MODEL, DEFAULT_MODEL_SHA256, LlamaCppEmbedder, file_sha256
from appliance.cache.lexical import compatible, signature
from tests.cachekit import MODEL, chat, chat_result, completion, completion_result, make_cache, principal

WHO = principal(1)


@pytest.fixture(scope="module")
def embedder():
    e = LlamaCppEmbedder()
    yield e
    e.close()


@pytest.fixture
def cache(tmp_path, embedder):
    c = make_cache(tmp_path, embedder)
    yield c
    c.close()


def test_shipped_model_is_the_recorded_file():
    assert file_sha256(DEFAULT_MODEL) == DEFAULT_MODEL_SHA256


def test_embeddings_are_normalized_and_meaningful(embedder):
    v = embedder.embed(["How do I reset my password?", "How can I reset my password?", "Recipe for banana bread"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > 0.95 > 0.3 > v[0] @ v[2]
    # tokenization matches bert-base-uncased (the WordPiece vocabulary survived the conversion)
    assert embedder._model.tokenize(b"This is an example sentence") == [101, 2023, 2003, 2019, 2742, 6251, 102]


def store(cache, body, result=None, who=WHO, endpoint="chat"):
    cache.store(who, endpoint, MODEL, body, result or chat_result(), {})
    cache.flush()


async def test_paraphrase_is_a_semantic_hit(cache):
    store(cache, chat("How do I reset my password?"), chat_result("Use the self-service portal."))
    hit = await cache.lookup_async(WHO, "chat", MODEL, chat("How can I reset my password?"), {})
    assert hit is not None and hit.tier == "semantic"
    assert 0.95 <= hit.similarity <= 1.0
    assert json.loads(hit.body)["choices"][0]["message"]["content"] == "Use the self-service portal."
    assert cache.stats()["hits_by_tier"] == {"exact": 0, "semantic": 1}


async def test_exact_tier_answers_first_and_sync_lookup_never_embeds(cache):
    store(cache, chat("How do I reset my password?"))
    assert (await cache.lookup_async(WHO, "chat", MODEL, chat("How do I reset my password?"), {})).tier == "exact"
    assert cache.lookup(WHO, "chat", MODEL, chat("How can I reset my password?"), {}) is None


@pytest.mark.parametrize(
    "stored_text, asked",
    [
        ("What is 15% of 200?", "What is 15% of 300?"),
        ("Which foods are safe for dogs?", "Which foods are not safe for dogs?"),
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Convert Celsius to Fahrenheit.", "Convert Fahrenheit to Celsius."),
        ("How do I enable dark mode?", "How do I disable dark mode?"),
        ("Bake the bread for 20 minutes.", "Bake the bread for 20 hours."),  # cosine 0.98: only the units differ
    ],
)
async def test_near_misses_are_not_served(cache, stored_text, asked):
    store(cache, chat(stored_text))
    assert await cache.lookup_async(WHO, "chat", MODEL, chat(asked), {}) is None


async def test_matches_are_scoped_by_system_prompt_sampling_model_and_partition(cache):
    store(cache, chat("How do I reset my password?", system="You are IT support."))
    ask = "How can I reset my password?"
    assert await cache.lookup_async(WHO, "chat", MODEL, chat(ask, system="You are IT support."), {}) is not None
    assert await cache.lookup_async(WHO, "chat", MODEL, chat(ask, system="You are a pirate."), {}) is None
    assert await cache.lookup_async(WHO, "chat", MODEL, chat(ask, system="You are IT support.", max_tokens=7), {}) is None
    assert await cache.lookup_async(WHO, "chat", "tiny:f16", chat(ask, system="You are IT support."), {}) is None
    assert await cache.lookup_async(principal(2), "chat", MODEL, chat(ask, system="You are IT support."), {}) is None


async def test_policy_turns_the_tier_off_or_changes_the_threshold(cache):
    store(cache, chat("How do I reset my password?"))
    ask = chat("How can I reset my password?")
    assert await cache.lookup_async(principal(1, policy={"semantic": False}), "chat", MODEL, ask, {}) is None
    assert await cache.lookup_async(principal(1, policy={"semantic_threshold": 0.999}), "chat", MODEL, ask, {}) is None
    assert await cache.lookup_async(principal(1, policy={"semantic_threshold": 0.9}), "chat", MODEL, ask, {}) is not None


async def test_completions_prompts_match_too(cache):
    store(cache, completion("Write a haiku about autumn."), completion_result(" Leaves fall."), endpoint="completions")
    hit = await cache.lookup_async(WHO, "completions", MODEL, completion("Write me a haiku about autumn."), {})
    assert hit is not None and hit.tier == "semantic"


async def test_index_reloads_from_sqlite_and_follows_purges(tmp_path, embedder):
    first = make_cache(tmp_path, embedder)
    store(first, chat("How do I reset my password?"))
    first.close()
    second = make_cache(tmp_path, embedder)
    try:
        ask = chat("How can I reset my password?")
        assert (await second.lookup_async(WHO, "chat", MODEL, ask, {})).tier == "semantic"
        assert second.purge(model=MODEL) == 1
        assert await second.lookup_async(WHO, "chat", MODEL, ask, {}) is None
        assert second.stats()["semantic"]["vectors_loaded"] == 0
    finally:
        second.close()


async def test_a_miss_embedding_is_reused_by_the_store(cache, embedder, monkeypatch):
    assert await cache.lookup_async(WHO, "chat", MODEL, chat("Explain recursion to a beginner."), {}) is None
    calls = []
    monkeypatch.setattr(embedder, "embed", lambda texts, _orig=embedder.embed: calls.append(texts) or _orig(texts))
    store(cache, chat("Explain recursion to a beginner."))
    assert calls == []


async def test_long_prompts_are_exact_only(cache):
    long_text = "Please review this contract. " + "The party agrees to the terms. " * 100
    store(cache, chat(long_text))
    assert await cache.lookup_async(WHO, "chat", MODEL, chat(long_text + " Thanks."), {}) is None
    assert (await cache.lookup_async(WHO, "chat", MODEL, chat(long_text), {})).tier == "exact"


def test_lexical_check_examples():
    assert compatible("What's the GDP of Germany?", "What is the GDP of germany")
    assert compatible("Give me three tips for better sleep.", "Give me 3 tips for sleeping better.")
    assert not compatible("Is 91 a prime number?", "Is 97 a prime number?")
    assert not compatible("Why do cats purr?", "Why don't cats purr?")
    assert not compatible("Who wrote Hamlet?", "Who wrote Macbeth?")
    assert not compatible("How do I lock my screen?", "How do I unlock my screen?")
    assert not compatible("Translate from English to German: hi", "Translate from German to English: hi")


@pytest.mark.parametrize(
    "one, other",
    [
        ("How long does it take to run 5 km?", "How long does it take to run 5 miles?"),
        ("Add 3 cups of flour.", "Add 4 cups of flour."),
        ("Convert 5 km and 3 miles to metres.", "Convert 3 km and 5 miles to metres."),
        ("How many cups are in a gallon?", "How many cups are in a quart?"),
        ("Is 8 GB of RAM enough?", "Is 8 MB of RAM enough?"),
        ("Can I live on $2000 a month?", "Can I live on €2000 a month?"),
        ("Is 100°F hot?", "Is 100°C hot?"),
        ("Bake the bread for 20 minutes.", "Bake the bread for 20 hours."),
    ],
)
def test_units_and_their_quantities_must_agree(one, other):
    assert not compatible(one, other) and not compatible(other, one)


@pytest.mark.parametrize(
    "one, other",
    [
        ("How far is 5 km?", "How far is five kilometres?"),
        ("Is a 5km run long?", "Is a 5-kilometer run long?"),
        ("What is 15% of 200?", "What is 15 percent of 200?"),
        ("Is $5 a good tip?", "Is 5 dollars a good tip?"),
        ("Is 8 GB of RAM enough?", "Is 8 gigabytes of RAM enough?"),
        ("Boil the eggs for 10 minutes.", "Boil the eggs for 10 mins."),
    ],
)
def test_spellings_of_one_unit_agree(one, other):
    assert compatible(one, other) and compatible(other, one)


def test_signature_binds_each_quantity_to_its_unit():
    s = signature("Mix 2 cups of milk with 500 g of flour and $3 of sugar, then bake at 180 degrees Celsius.")
    assert s.units == {"cup", "g", "usd", "celsius"}
    assert dict(s.quantities) == {("2", "cup"): 1, ("500", "g"): 1, ("3", "usd"): 1, ("180", "celsius"): 1}


async def test_semantic_lookups_are_skipped_when_the_embedding_thread_is_busy(cache):
    import asyncio

    from appliance.cache.semantic_tier import SEMANTIC_MAX_PENDING

    questions = [f"Question number {i}: what colour is the sky?" for i in range(SEMANTIC_MAX_PENDING + 3)]
    results = await asyncio.gather(*(cache.lookup_async(WHO, "chat", MODEL, chat(q), {}) for q in questions))
    assert results == [None] * len(questions)
    s = cache.stats()
    assert s["semantic"]["skipped_busy"] == 3 and s["misses"] == len(questions)


async def test_the_database_is_free_for_other_writers_while_a_stored_prompt_is_embedded(cache, embedder, monkeypatch):
    """The writer embeds, folds and encodes before its transaction: the ledger never waits for an embedding."""
    import sqlite3

    free_during_embedding: list[bool] = []
    real_embed = embedder.embed

    def embed_and_try_the_lock(texts):
        other = sqlite3.connect(cache._rows._path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            free_during_embedding.append(True)
        except sqlite3.OperationalError:
            free_during_embedding.append(False)
        finally:
            other.close()
        return real_embed(texts)

    monkeypatch.setattr(embedder, "embed", embed_and_try_the_lock)
    store(cache, chat("What is the capital of France?"), chat_result("Paris."))
    assert free_during_embedding == [True]
    hit = await cache.lookup_async(WHO, "chat", MODEL, chat("What's the capital of France?"), {})
    assert hit is not None and hit.tier == "semantic"  # the embedding made in the writer was stored with the row


def test_every_embedding_is_computed_on_the_embedders_own_thread(monkeypatch):
    """The lookups' thread and the cache writer both embed; libllama computes on one thread only (see
    ``drivers/llamacpp/context.py`` for what a second computing thread costs)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import llama_cpp.llama_cpp as ll

    callers: list[str] = []

    def recording(real):
        def call(ctx, batch):
            callers.append(threading.current_thread().name)
            return real(ctx, batch)

        return call

    monkeypatch.setattr(ll, "llama_decode", recording(ll.llama_decode))
    monkeypatch.setattr(ll, "llama_encode", recording(ll.llama_encode))
    e = LlamaCppEmbedder(threads=2)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="caller") as callers_pool:
            rows = list(callers_pool.map(lambda t: e.embed([t]), ["first text", "second text", "third", "fourth"]))
    finally:
        e.close()
    assert all(r.shape == (1, 384) for r in rows)
    assert len(callers) >= 4
    assert {name.split("_")[0] for name in callers} == {"cache-embedder"}
    with pytest.raises(RuntimeError, match="closed"):
        e.embed(["after close"])
