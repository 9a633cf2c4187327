"""vLLM for real: the CPU build serving a tiny random-weight Llama, driven through the appliance.

Two layers:

(a) the supervisor alone: ``EngineProcess(driver=VllmDriver())`` with a plan made
    here, talking to the engine over its Unix socket with the driver's key;
(b) the whole daemon: import the HF folder into the store, request it through
    ``/v1/chat/completions`` with an API key, find the usage row, unload.

The vLLM environment comes from ``tests/vllm_env.sh`` (``<repo>/.venv-vllm``;
``APPLIANCE_TEST_VLLM_VENV`` points elsewhere). Without it the tests skip on a
developer's machine and FAIL in CI (``CI=true``), with the reason.

Measurements (start time, tokens/s) go to ``test-artifacts/vllm-measurements.json``
and the test log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest

from appliance.drivers.vllm import VllmDriver, build_args
from appliance.serving.engines import EngineProcess
from tests.hfkit import make_tiny_hf_llama

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama:f32"
GiB = 1 << 30
ARTIFACTS = REPO / "test-artifacts"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"vLLM environment unusable in CI: {reason}", pytrace=False)
    pytest.skip(f"vLLM environment unusable: {reason} (run tests/vllm_env.sh {REPO / '.venv-vllm'})")


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    venv = Path(os.environ.get("APPLIANCE_TEST_VLLM_VENV") or REPO / ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        _unavailable(f"{python} does not exist")
    if not (venv / ".appliance-vllm-stamp").exists():
        _unavailable(f"{venv} was not completed by tests/vllm_env.sh (no stamp)")
    probe = subprocess.run(
        [str(python), "-c", "import vllm.entrypoints.openai.api_server, transformers"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if probe.returncode != 0:
        _unavailable(f"{python} cannot import vLLM: {probe.stderr.strip()[-800:]}")
    return python


@pytest.fixture(scope="module")
def tiny_hf(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny-llama", vllm_python)


def cpu_fraction(wanted_bytes: int = 3 * GiB) -> float:
    """What the planner does on the CPU backend: a fraction of memory, from bytes wanted."""
    return round(min(0.5, wanted_bytes / psutil.virtual_memory().total), 4)


@dataclasses.dataclass(frozen=True)
class VllmPlan:
    model_path: str
    model: str = MODEL
    variant: str = "f32"
    backend: str = "vllm"
    context: int = 512
    parallel: int = 8
    threads: int | None = None
    n_gpu_layers: int = 0
    devices: tuple[str, ...] = ("cpu",)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    quantization: str | None = None
    estimated_bytes: int = 3 * GiB
    distributed_executor: str | None = None


def _record(key: str, value: object) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "vllm-measurements.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2))
    print(f"vllm measurement {key}: {value}")


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _sse_events(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


def test_vllm_parses_every_argument_the_driver_emits(vllm_python: Path, tmp_path: Path):
    """vLLM's own parser accepts the argv of a busy GPU plan (flags renamed upstream fail here)."""
    plan = VllmPlan(
        model_path=str(tmp_path),
        devices=("cuda:0", "cuda:1"),
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        distributed_executor="ray",
        kv_cache_dtype="fp8",
        quantization="awq-int4",
        gpu_memory_utilization=0.9,
    )
    argv = build_args(plan, tmp_path / "e.sock", SimpleNamespace(vllm_python=vllm_python, ray_address="10.0.0.5:6379"))
    code = (
        "import sys, json\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "try:\n"
        "    from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "except ImportError:  # vLLM before the launchers package\n"
        "    from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "print(json.dumps({k: getattr(args, k) for k in ('uds', 'model', 'served_model_name', 'max_model_len', 'max_num_seqs',"
        " 'gpu_memory_utilization', 'kv_cache_dtype', 'quantization', 'tensor_parallel_size', 'pipeline_parallel_size',"
        " 'distributed_executor_backend', 'enable_prefix_caching', 'trust_remote_code', 'api_key')}))\n"
    )
    result = subprocess.run([str(vllm_python), "-c", code, *argv[3:]], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["uds"] == str(tmp_path / "e.sock") and parsed["served_model_name"] == [MODEL]
    assert (parsed["tensor_parallel_size"], parsed["pipeline_parallel_size"]) == (2, 2)
    assert parsed["distributed_executor_backend"] == "ray" and parsed["quantization"] == "awq"
    assert parsed["kv_cache_dtype"] == "fp8" and parsed["enable_prefix_caching"] is True
    assert parsed["trust_remote_code"] is False and parsed["api_key"] is None  # the key comes from VLLM_API_KEY


async def _stream_completion(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to first token, seconds in all, completion tokens from usage) of one streamed completion."""
    started = time.perf_counter()
    first = None
    usage = None
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and event.get("choices") and event["choices"][0].get("text"):
                first = time.perf_counter() - started
            if event.get("usage"):
                usage = event["usage"]
    assert usage is not None, "no usage event in the stream"
    return first or 0.0, time.perf_counter() - started, usage["completion_tokens"]


async def test_engine_process_serves_vllm_and_unload_frees_it(vllm_python: Path, tiny_hf: Path, tmp_path: Path):
    plan = VllmPlan(model_path=str(tiny_hf), gpu_memory_utilization=cpu_fraction())
    settings = SimpleNamespace(
        vllm_python=vllm_python, ray_address=None, request_timeout_seconds=120.0, load_timeout_seconds=240.0
    )
    socket_path = tmp_path / "run" / "engine-vllm.sock"
    engine = EngineProcess(MODEL, plan, VllmDriver(), settings, socket_path)
    started = time.monotonic()
    try:
        await engine.start()
        _record("cpu_start_seconds", round(time.monotonic() - started, 1))
        assert engine.state == "ready"
        # The engine's routes need the driver's key, which the supervisor's client sends on every request.
        assert engine.client.headers["authorization"].startswith("Bearer ")
        client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
            base_url="http://engine",
            headers=engine.client.headers,
            timeout=120,
        )
        status, listed = await engine.client.get("/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(listed)["data"]] == [MODEL]

        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL]

        # The engine's routes need the driver's key; the supervisor's client carries it.
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(socket_path)), base_url="http://engine") as bare:
            assert (await bare.get("/v1/models")).status_code == 401
            assert (await bare.post("/v1/completions", json={"model": MODEL, "prompt": "x"})).status_code == 401
        # The API listens on its socket only. vLLM's internal channels (ZMQ between the API
        # server and the engine core, torch.distributed's gloo store) use TCP, on loopback only.
        listening = [
            (p.name(), c.laddr)
            for p in _tree(engine.pid)
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert [(name, addr) for name, addr in listening if not ipaddress.ip_address(addr.ip).is_loopback] == []
        _record("loopback_listeners", sorted(f"{name} {addr.ip}:{addr.port}" for name, addr in listening))

        # Completions, not streamed.
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": True},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == 8 and body["usage"]["prompt_tokens"] > 0
        assert isinstance(body["choices"][0]["text"], str)

        # Chat, not streamed (the tokenizer's chat template renders the prompt).
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = await client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"] == {**body["usage"], "completion_tokens": 6}
        # The template rendered "<s><|user|>Say hi<|assistant|>": three special tokens and six bytes.
        assert body["usage"]["prompt_tokens"] == 3 + len("Say hi")

        # Chat, streamed, with usage as the gateway asks for it.
        r = await client.post("/v1/chat/completions", json={**chat, "stream": True, "stream_options": {"include_usage": True}})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 6 and chunks[-1]["choices"] == []
        assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)

        # Prefix caching shows in usage (the meter reads cached_tokens).
        long_prompt = "the same long prefix " * 20
        for _ in range(2):
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": long_prompt, "max_tokens": 1})
        assert (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) > 0

        # Throughput on the tiny model (numbers for the report, loose floor only).
        ttft, total, tokens = await _stream_completion(client, "once upon a time", 128)
        assert tokens == 128
        _record("single_stream", {"tokens": tokens, "tokens_per_s": round(tokens / total, 1), "ttft_s": round(ttft, 3)})
        t0 = time.perf_counter()
        results = await asyncio.gather(*[_stream_completion(client, f"prompt number {i}", 64) for i in range(8)])
        wall = time.perf_counter() - t0
        _record(
            "eight_streams",
            {
                "tokens": sum(r[2] for r in results),
                "aggregate_tokens_per_s": round(sum(r[2] for r in results) / wall, 1),
                "ttft_p_max_s": round(max(r[0] for r in results), 3),
            },
        )
        assert sum(r[2] for r in results) == 8 * 64

        rss = engine.rss_bytes()
        assert rss and rss > 100 << 20
        _record("cpu_engine_rss_mib", rss >> 20)
        pids = [p.pid for p in _tree(engine.pid)]
        assert len(pids) >= 2  # the API server and its engine core (and worker)
        await client.aclose()
    finally:
        pids = [p.pid for p in _tree(engine.pid)] if engine.pid and psutil.pid_exists(engine.pid) else []
        t0 = time.monotonic()
        await engine.stop()

    # Unloaded: every process of the tree is gone (so is its memory), the socket too.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        await asyncio.sleep(0.1)
    assert [pid for pid in pids if _alive(pid)] == []
    _record("cpu_stop_seconds", round(time.monotonic() - t0, 1))
    assert not socket_path.exists()
    assert engine.state == "stopped"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- (b) the whole daemon ---------------------------------------------------------------------


def _wait_job(admin: httpx.Client, job: dict, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = admin.get(f"/admin/jobs/{job['id']}").json()
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job['id']} still {job['state']} after {timeout} s")


def test_daemon_serves_an_imported_hf_model_on_vllm(vllm_python: Path, tiny_hf: Path, tmp_path: Path):
    """Import → request with a key → usage row → unload, all through the real daemon.

    On this CPU box the planner picks vLLM only when asked (``APPLIANCE_BACKEND=vllm``);
    it computes ``gpu_memory_utilization`` from the machine's RAM.
    """
    from tests.daemon import start_daemon

    t0 = time.monotonic()
    daemon = start_daemon(
        tmp_path,
        APPLIANCE_VLLM_PYTHON=str(vllm_python),
        APPLIANCE_BACKEND="vllm",
        APPLIANCE_ENGINE_CONTEXT="1024",
        APPLIANCE_ENGINE_PARALLEL="4",
        APPLIANCE_LOAD_TIMEOUT_SECONDS="240",
    )
    _record("daemon_start_seconds", round(time.monotonic() - t0, 1))
    try:
        with daemon.admin() as admin:
            t0 = time.monotonic()
            response = admin.post("/admin/models/import", json={"path": str(tiny_hf), "name": MODEL})
            assert response.status_code == 202, response.text
            job = _wait_job(admin, response.json())
            assert job["state"] == "done", job
            _record("daemon_import_seconds", round(time.monotonic() - t0, 1))
            listed = {m["name"]: m for m in admin.get("/admin/models/").json()}
            assert listed[MODEL]["format"] == "safetensors"

        key = daemon.create_key("vllm-e2e")
        started = time.monotonic()
        with daemon.client(key) as client:
            chat = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say hi"}],
                "max_tokens": 5,
                "temperature": 0,
                "ignore_eos": True,
            }
            r = client.post("/v1/chat/completions", json=chat)  # loads on demand
            assert r.status_code == 200, (r.text, daemon.log()[-3000:])
            _record("daemon_first_request_seconds", round(time.monotonic() - started, 1))
            body = r.json()
            assert body["model"] == MODEL and body["usage"]["completion_tokens"] == 5
            assert body["usage"]["prompt_tokens"] == 3 + len("Say hi")

            with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as s:
                assert s.status_code == 200
                events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
            # The gateway asks the engine for usage (for the meter) but shows it only to clients that ask.
            assert not any(c.get("usage") for c in chunks)

            # Routes outside the allow-list never reach the engine.
            assert client.post("/invocations", json={"prompt": "x"}).status_code in (404, 405)
            assert client.post("/tokenize", json={"model": MODEL, "prompt": "x"}).status_code in (404, 405)

        with daemon.admin() as admin:
            instances = {i["model"]: i for i in admin.get("/admin/instances/").json()}
            assert instances[MODEL]["backend"] == "vllm" and instances[MODEL]["state"] == "ready"
            pid = instances[MODEL]["pid"]
            pids = [p.pid for p in _tree(pid)]
            # The engine's key lives in its environment, not on its command line nor in the log.
            engine_key = psutil.Process(pid).environ()["VLLM_API_KEY"]
            assert len(engine_key) >= 32
            assert not any(engine_key in " ".join(p.cmdline()) for p in _tree(pid))
            log = daemon.log()
            assert engine_key not in log
            assert "non-default args" in log  # vLLM's own log reaches the appliance log
            _record("daemon_engine_rss_mib", (instances[MODEL]["rss_bytes"] or 0) >> 20)

            deadline = time.monotonic() + 10
            while True:
                usage = admin.get("/admin/usage", params={"model": MODEL}).json()["totals"]
                if usage["requests"] >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert usage["requests"] == 2 and usage["failed"] == 0
            assert usage["completion_tokens"] == 10 and usage["prompt_tokens"] == 2 * 9

            r = admin.post(f"/admin/instances/{MODEL}/unload")
            assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
            assert MODEL not in {i["model"] for i in admin.get("/admin/instances/").json()}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == []
    finally:
        daemon.stop()
