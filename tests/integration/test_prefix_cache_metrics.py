"""The engines' prefix cache hit rate in /metrics: prompt tokens asked and reused, through the real daemon and engine."""

from __future__ import annotations

import re
import time


def _prefix_tokens(daemon) -> dict[str, int]:
    with daemon.admin() as admin:
        text = admin.get("/metrics").text
    totals = {"asked": 0, "reused": 0}
    for kind, n in re.findall(r'^appliance_prefix_cache_tokens_total\{model="[^"]*",kind="(asked|reused)"\} (\d+)$', text, re.M):
        totals[kind] += int(n)
    return totals


def test_a_repeated_long_prefix_shows_as_reused_tokens(daemon, api_key):
    before = _prefix_tokens(daemon)
    system = f"Session {time.time_ns()}. " + " ".join(f"Rule {i}: keep answers short and cite rule {i}." for i in range(40))
    usages = []
    with daemon.client(api_key) as client:
        for question in ("What is rule 3?", "What is rule 5?"):
            body = {
                "model": "default",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": 2,
                "temperature": 0,
            }
            r = client.post("/v1/chat/completions", json=body, headers={"cache-control": "no-store"})
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
    after = _prefix_tokens(daemon)
    asked = sum(u["prompt_tokens"] for u in usages)
    reused = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    assert reused > 300  # the second request read only its question: the long system prompt was reused
    assert after["asked"] - before["asked"] == asked
    assert after["reused"] - before["reused"] == reused
