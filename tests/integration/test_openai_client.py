"""The official `openai` client against the real daemon and the real llama.cpp engine."""

import openai
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(daemon, api_key):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=api_key, max_retries=0, timeout=300)


def test_models_lists_default_and_alias(client):
    ids = {m.id for m in client.models.list().data}
    assert "gemma-3-270m:q4_k_m" in ids
    assert "default" in ids


def test_chat(client):
    reply = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=16, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens > 0
    assert reply.model == "gemma-3-270m:q4_k_m"


def test_streamed_chat_with_usage(client):
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Count: one, two,"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0


def test_stream_without_usage_option_has_no_usage_chunk(client):
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.usage is None for c in chunks)


def test_completions(client):
    reply = client.completions.create(model="gemma-3-270m", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert reply.choices[0].text
    assert reply.usage.completion_tokens > 0


def test_embeddings(client):
    result = client.embeddings.create(model="default", input=["hello world", "goodbye"])
    assert len(result.data) == 2
    assert len(result.data[0].embedding) > 10
    assert result.usage.prompt_tokens > 0


def test_responses_plain_text(client):
    response = client.responses.create(model="default", input="Say hello.", max_output_tokens=8, temperature=0)
    assert response.output_text is not None
    assert response.usage.output_tokens > 0


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "no-such-model" in str(info.value)


def test_bad_key_is_authentication_error(daemon):
    bad = openai.OpenAI(base_url=daemon.url + "/v1", api_key="ak_not-a-real-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_invalid_request_is_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}], temperature=5)
    assert info.value.body["type"] == "invalid_request_error" if isinstance(info.value.body, dict) else True
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=[])


def test_rate_limit_error_class(daemon):
    """A full admission queue (or a spent quota) raises RateLimitError with Retry-After."""
    key = daemon.create_key("rate-limited")
    with daemon.admin() as admin:
        response = admin.put("/admin/quotas/key:" + key[:12], json={"requests_per_minute": 1})
        if response.status_code == 404:
            pytest.fail("quota API missing: /admin/quotas")
        response.raise_for_status()
    limited = openai.OpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0, timeout=120)
    limited.chat.completions.create(model="default", messages=[{"role": "user", "content": "a"}], max_tokens=2, temperature=0)
    with pytest.raises(openai.RateLimitError) as info:
        limited.chat.completions.create(model="default", messages=[{"role": "user", "content": "b"}], max_tokens=2, temperature=0)
    assert info.value.response.headers.get("retry-after")
