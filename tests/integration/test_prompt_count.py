"""Quota reservations hold the prompt the engine will bill, counted with the model's own tokenizer.

Through the real daemon and the default model (Gemma 3 270M): Chinese, rare
4-byte characters and code, as completions, chats and embedding inputs. The
daemon's count (a vocabulary-only copy of the model, the same chat template) is
the engine's ``usage.prompt_tokens``; and a key whose daily budget is that count
plus one token is admitted for a one-token answer, which a reservation from the
prompt's bytes (three per Chinese character, plus the template's allowance) refuses.
"""

from __future__ import annotations

import msgspec
import pytest

from appliance.drivers.llamacpp.prompts import PromptCounter
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest
from appliance.serving.prompt_tokens import prompt_bound
from tests.daemon import RunningDaemon

CHINESE = "请用三句话介绍一下长城的历史，以及它在中国文化中的意义。" * 10
RARE = "".join(chr(0x20000 + i * 37) for i in range(450))  # CJK Extension B, 4 bytes each in UTF-8
CODE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 8

CASES = {
    "chinese-completion": ("completions", "/v1/completions", {"prompt": CHINESE}),
    "rare-completion": ("completions", "/v1/completions", {"prompt": RARE}),
    "code-completion": ("completions", "/v1/completions", {"prompt": CODE}),
    "chinese-chat": (
        "chat",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "你是一个乐于助人的助手。"}, {"role": "user", "content": CHINESE}]},
    ),
    "chinese-embedding": ("embeddings", "/v1/embeddings", {"input": [CHINESE, "长城"]}),
}


@pytest.fixture(scope="module")
def counter(default_gguf):
    c = PromptCounter(str(default_gguf))
    yield c
    c.close()


def _body(body: dict, endpoint: str) -> dict:
    body = {"model": "default", **body}
    if endpoint != "embeddings":
        body.update(max_tokens=1, temperature=0)
    return body


@pytest.mark.parametrize("case", list(CASES))
def test_the_daemons_count_is_the_engines(daemon: RunningDaemon, api_key: str, counter: PromptCounter, case: str):
    endpoint, path, body = CASES[case]
    body = _body(body, endpoint)
    with daemon.client(api_key, timeout=300) as c:
        r = c.post(path, json=body, headers={"cache-control": "no-store"})
    assert r.status_code == 200, r.text[:300]
    billed = r.json()["usage"]["prompt_tokens"]
    assert counter.count(endpoint, body) == billed, (case, billed)


@pytest.mark.parametrize("case", ["chinese-completion", "rare-completion", "chinese-chat"])
def test_a_budget_of_exactly_the_prompt_admits_it(daemon: RunningDaemon, counter: PromptCounter, case: str):
    endpoint, path, body = CASES[case]
    body = _body(body, endpoint)
    needed = counter.count(endpoint, body) + 1  # the prompt and the one-token answer
    request = msgspec.convert(body, ChatCompletionRequest if endpoint == "chat" else CompletionRequest)
    assert prompt_bound(request) > needed  # the reservation from the prompt's bytes would not fit this budget
    secret = daemon.create_key(f"exact-{case}")
    with daemon.admin() as admin:
        admin.put(f"/admin/quotas/key:{secret[:12]}", json={"tokens_per_day": needed}).raise_for_status()
    with daemon.client(secret, timeout=300) as c:
        r = c.post(path, json=body, headers={"cache-control": "no-store"})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["usage"]["prompt_tokens"] + r.json()["usage"]["completion_tokens"] <= needed
        again = c.post(path, json=body, headers={"cache-control": "no-store"})
    assert again.status_code == 429, again.text[:300]  # the budget is spent: the next one does not fit
    with daemon.admin() as admin:
        spent = admin.get(f"/admin/quotas/key:{secret[:12]}").json()["usage"]["tokens_per_day"]
    assert spent["spent"] <= needed and spent["reserved"] == 0, spent
