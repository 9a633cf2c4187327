"""Schemas that explode at compile time (README security table, row 28), on every entry point that takes one.

Through the real daemon on the default model (Gemma 3 270M, 262k-token vocabulary),
from an ordinary user key. Before the schema limits and the move to llguidance, a
250-byte ``minLength: 200000000`` schema was a 400 only after 10.7 s, with the
engine's RSS up from 978 MB to 4,121 MB and a light chat beside it waiting 32 s;
a 6,500-alternative ``pattern`` was accepted and took 157 s for 8 tokens. Here every
entry point must refuse the first within 2 s with the engine's RSS up by at most
100 MB (``VmRSS`` of the engine process), answer the second (refused or served)
within 5 s, and a light chat beside each must be answered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.daemon import RunningDaemon, start_daemon
from tests.security.test_heavy_requests import beside, light_latency

pytestmark = pytest.mark.slow

BOMB = {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}, "required": ["a"]}
ALTERNATIVES = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^(" + "|".join(f"w{i:04d}x" for i in range(3000)) + ")$"}},
    "required": ["a"],
}
BOMB_BOUND_S = 2.0
ALTERNATIVES_BOUND_S = 5.0
RSS_BOUND_KB = 100 * 1024
HI = [{"role": "user", "content": "Hi"}]


def _fn(schema: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


#: entry point → (path, body carrying the schema, the field a refusal names)
ENTRY_POINTS: dict[str, tuple[str, Callable[[dict], dict], str]] = {
    "chat response_format": (
        "/v1/chat/completions",
        lambda s: {
            "model": "default",
            "messages": HI,
            "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": s}},
        },
        "response_format",
    ),
    "chat tools required": (
        "/v1/chat/completions",
        lambda s: {"model": "default", "messages": HI, "max_tokens": 8, "tools": _fn(s), "tool_choice": "required"},
        "tools",
    ),
    "chat tools named": (
        "/v1/chat/completions",
        lambda s: {
            "model": "default",
            "messages": HI,
            "max_tokens": 8,
            "tools": _fn(s),
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        "tools",
    ),
    "completions response_format": (
        "/v1/completions",
        lambda s: {
            "model": "default",
            "prompt": "Hi",
            "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": s}},
        },
        "response_format",
    ),
    "messages output_config": (
        "/v1/messages",
        lambda s: {
            "model": "default",
            "max_tokens": 8,
            "messages": HI,
            "output_config": {"format": {"type": "json_schema", "schema": s}},
        },
        "output_config.format",
    ),
    "messages tool_choice any": (
        "/v1/messages",
        lambda s: {
            "model": "default",
            "max_tokens": 8,
            "messages": HI,
            "tools": [{"name": "f", "input_schema": s}],
            "tool_choice": {"type": "any"},
        },
        "tools",
    ),
    "responses text.format": (
        "/v1/responses",
        lambda s: {
            "model": "default",
            "input": "Hi",
            "max_output_tokens": 16,
            "text": {"format": {"type": "json_schema", "name": "o", "schema": s}},
        },
        "text.format",
    ),
    "ollama chat format": (
        "/api/chat",
        lambda s: {"model": "default", "messages": HI, "format": s, "stream": False, "options": {"num_predict": 8}},
        "format",
    ),
    "ollama generate format": (
        "/api/generate",
        lambda s: {"model": "default", "prompt": "Hi", "format": s, "stream": False, "options": {"num_predict": 8}},
        "format",
    ),
}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory):
    daemon = start_daemon(tmp_path_factory.mktemp("bombs"))
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def key(box: RunningDaemon) -> str:
    return box.create_key("bombs")


@pytest.fixture(scope="module")
def engine_pid(box: RunningDaemon, key: str) -> int:
    light_latency(box, key)  # loads the engine
    pids = [
        p.pid
        for p in psutil.Process(box.proc.pid).children(recursive=True)
        if "appliance.drivers.llamacpp.worker" in " ".join(p.cmdline())
    ]
    assert len(pids) == 1, pids
    return pids[0]


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _names_the_field(response, field: str) -> bool:
    body = response.json()
    error = body.get("error")
    if isinstance(error, dict) and error.get("param"):
        return error["param"] == field
    # Anthropic's and Ollama's error shapes carry no param: the message names it (as a whole name: not `response_format`)
    return re.search(rf"(?<![\w.]){re.escape(field)}\b", response.text) is not None


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_minlength_bomb_is_refused_at_once(box, key, engine_pid, entry):
    path, body, field = ENTRY_POINTS[entry]
    before = vm_rss_kb(engine_pid)
    _, heavy, heavy_s = beside(box, key, path, body(BOMB), lead=0.2)
    grown = vm_rss_kb(engine_pid) - before
    assert heavy.status_code == 400, heavy.text[:500]
    assert "minLength" in heavy.text and _names_the_field(heavy, field), heavy.text[:500]
    assert heavy_s < BOMB_BOUND_S, f"{entry}: refused only after {heavy_s:.1f} s"
    assert grown < RSS_BOUND_KB, f"{entry}: the engine's RSS grew by {grown / 1024:.0f} MB"


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_3000_alternative_pattern_is_answered_quickly(box, key, engine_pid, entry):
    path, body, _ = ENTRY_POINTS[entry]
    _, heavy, heavy_s = beside(box, key, path, body(ALTERNATIVES), lead=0.2)
    assert heavy.status_code in (200, 400), heavy.text[:500]
    assert heavy_s < ALTERNATIVES_BOUND_S, f"{entry}: answered only after {heavy_s:.1f} s"


def test_100000_logit_bias_entries_are_refused(box, key):
    body = {"model": "default", "messages": HI, "max_tokens": 4, "logit_bias": {str(i): 1 for i in range(100_000)}}
    with box.client(key, timeout=60) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text[:500]
    assert r.json()["error"]["param"] == "logit_bias"
