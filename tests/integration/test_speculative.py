"""``speculative_ngram`` drives the llama.cpp worker for real (README configuration reference).

A daemon started with ``APPLIANCE_SPECULATIVE_NGRAM=true`` serves the default
model with prompt-lookup drafts: after a completion whose prompt repeats itself,
the worker's own counters (read from its socket) show drafts proposed and
accepted. A daemon without the setting proposes none.
"""

from __future__ import annotations

import httpx
import pytest

from tests.daemon import RunningDaemon, start_daemon

pytestmark = pytest.mark.slow

PROMPT = "Monday, Tuesday, Wednesday, Thursday, Friday. " * 6 + "Monday, Tuesday,"


def _worker_stats(daemon: RunningDaemon) -> dict:
    sockets = sorted((daemon.data_dir / "run").glob("engine-*.sock"))
    assert len(sockets) == 1, sockets
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sockets[0])), base_url="http://engine", timeout=30) as c:
        r = c.get("/stats")
    assert r.status_code == 200, r.text
    return r.json()


def _complete(daemon: RunningDaemon) -> dict:
    key = daemon.create_key("speculative")
    with daemon.client(key, timeout=300) as c:
        r = c.post(
            "/v1/completions",
            json={"model": "default", "prompt": PROMPT, "max_tokens": 24, "temperature": 0},
            headers={"cache-control": "no-store"},
        )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("enabled", [True, False])
def test_drafts_are_proposed_and_accepted_only_when_the_setting_is_on(tmp_path, enabled: bool):
    daemon = start_daemon(tmp_path, APPLIANCE_SPECULATIVE_NGRAM="true" if enabled else "false")
    try:
        answer = _complete(daemon)
        stats = _worker_stats(daemon)
    finally:
        daemon.stop()
    assert answer["usage"]["completion_tokens"] >= 8, answer
    if enabled:
        assert stats["spec_drafted_total"] > 0, stats
        assert 0 < stats["spec_accepted_total"] <= stats["spec_drafted_total"], stats
    else:
        assert stats["spec_drafted_total"] == 0, stats
