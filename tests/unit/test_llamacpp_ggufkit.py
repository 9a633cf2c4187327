"""The test kit's tiny GGUF is a real model: llama.cpp loads it and generates."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as ll

from tests.ggufkit import make_tiny_gguf


def _generate(path, prompt: bytes, n: int) -> list[int]:
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(str(path).encode(), mparams)
    assert model, "llama.cpp refused the tiny GGUF"
    try:
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = 128
        cparams.n_threads = cparams.n_threads_batch = 1
        ctx = ll.llama_init_from_model(model, cparams)
        assert ctx
        vocab = ll.llama_model_get_vocab(model)
        toks = (ll.llama_token * 64)()
        n_prompt = ll.llama_tokenize(vocab, prompt, len(prompt), toks, 64, True, False)
        assert n_prompt > 1
        smpl = ll.llama_sampler_init_greedy()
        out: list[int] = []
        batch = ll.llama_batch_get_one(toks, n_prompt)
        one = (ll.llama_token * 1)()
        for _ in range(n):
            assert ll.llama_decode(ctx, batch) == 0
            tok = ll.llama_sampler_sample(smpl, ctx, -1)
            out.append(tok)
            one[0] = tok
            batch = ll.llama_batch_get_one(one, 1)
        ll.llama_sampler_free(smpl)
        ll.llama_free(ctx)
        return out
    finally:
        ll.llama_model_free(model)


def test_tiny_gguf_loads_and_generates(tiny_gguf):
    out = _generate(tiny_gguf, b"hello world", 8)
    assert len(out) == 8
    assert all(0 <= t < 512 for t in out)


def test_tiny_gguf_is_deterministic(tmp_path):
    a = make_tiny_gguf(tmp_path / "a.gguf", seed=3)
    b = make_tiny_gguf(tmp_path / "b.gguf", seed=3)
    assert a.read_bytes() == b.read_bytes()


def test_tiny_gguf_tokenizer_round_trips_utf8(tiny_gguf):
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(tiny_gguf).encode(), ll.llama_model_default_params())
    try:
        vocab = ll.llama_model_get_vocab(model)
        text = 'hello wörld, the JSON model: {"a": 1} €😀'.encode()
        toks = (ll.llama_token * 256)()
        n = ll.llama_tokenize(vocab, text, len(text), toks, 256, False, False)
        buf = ctypes.create_string_buffer(1024)
        m = ll.llama_detokenize(vocab, toks, n, buf, 1024, False, False)
        assert buf.raw[:m].decode().strip() == text.decode()
    finally:
        ll.llama_model_free(model)


def test_tiny_gguf_stores_chat_template(tmp_path):
    tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}"
    path = make_tiny_gguf(tmp_path / "t.gguf", chat_template=tmpl)
    model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
    try:
        assert ll.llama_model_chat_template(model, None) == tmpl.encode()
    finally:
        ll.llama_model_free(model)
