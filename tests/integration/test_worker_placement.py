"""The worker started by the driver from a plan with a q8_0 KV cache and flash attention on answers.

A real worker process on a tiny random-weight model (head size 32, a multiple of the q8_0 block),
started with the exact argv and environment the llama.cpp driver builds. libllama's own log
(``APPLIANCE_LLAMA_VERBOSE``) shows that the cache type and the attention kernel were applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from appliance.drivers.llamacpp.driver import worker_command, worker_environment
from tests.ggufkit import WorkerProcess, make_tiny_gguf


@dataclass(frozen=True)
class CpuPlan:
    """The plan fields the llama.cpp driver reads, as the planner fills them for a CPU placement."""

    model_path: str
    kv_cache_dtype: str
    flash_attn: str
    model: str = "tiny"
    context: int = 256
    parallel: int = 4
    threads: int = 1
    n_gpu_layers: int = 0
    devices: tuple[str, ...] = ("cpu",)
    tensor_split: tuple[float, ...] = ()
    swa_full: bool = True


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_gguf(tmp_path_factory.mktemp("kv") / "tiny32.gguf", n_embd=64, n_head=2, n_kv_head=2)


@pytest.mark.parametrize(
    ("kv", "flash", "logged"),
    [
        ("q8_0", "on", "K (q8_0)"),
        ("q4_0", "on", "K (q4_0)"),
        ("f16", "off", "K (f16)"),
    ],
)
def test_worker_applies_the_kv_cache_type_and_flash_attention(model, tmp_path, monkeypatch, kv, flash, logged):
    plan = CpuPlan(str(model), kv, flash)
    monkeypatch.setenv("APPLIANCE_LLAMA_VERBOSE", "1")
    for name, value in worker_environment(plan).items():
        monkeypatch.setenv(name, value)
    worker = WorkerProcess(model, tmp_path / "w.sock")
    worker.argv = worker_command(plan, worker.socket)
    assert ["--kv-type", kv] == worker.argv[worker.argv.index("--kv-type") :][:2]
    with worker as w:
        with w.sync_client() as c:
            r = c.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": "hello world", "max_tokens": 6, "temperature": 0, "logit_bias": {"2": -100}},
            )
            chat = c.post(
                "/v1/chat/completions",
                json={"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]},
            )
        log = w.stderr()
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6
    assert chat.status_code == 200, chat.text
    kv_line = next(line for line in log.splitlines() if line.startswith("llama_kv_cache: size"))
    assert logged in kv_line and f"V ({kv})" in kv_line
    assert f"flash_attn            = {'enabled' if flash == 'on' else 'disabled'}" in log


def test_worker_refuses_a_quantized_cache_without_flash_attention(model, tmp_path):
    import subprocess
    import sys

    argv = [
        sys.executable,
        "-m",
        "appliance.drivers.llamacpp.worker",
        "--model",
        str(model),
        "--socket",
        str(tmp_path / "w.sock"),
        "--served-name",
        "tiny",
        "--kv-type",
        "q8_0",
        "--flash-attn",
        "off",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs flash attention" in done.stderr
    assert not (tmp_path / "w.sock").exists()
