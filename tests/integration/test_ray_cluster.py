"""A real Ray cluster on this machine: the product reads it, plans across it, builds vLLM's argv.

The test starts a Ray head and a second node (``ray start --block``, each in its own
process group, so teardown kills exactly those processes, even on failure), each with
2 logical GPUs tagged ``accelerator_type:L4`` (Ray's own tag for detected L4s). Then:

- :func:`read_cluster` (the subprocess in the vLLM environment) finds both nodes: the
  head as this box, the other as the cluster, 2 L4s each;
- the planner, given the head as this box (its GPUs as Ray reports them: this machine has
  no real GPU) and the read cluster, splits Llama 3.1 70B, which does not fit one node's
  two L4s, tensor parallel 2 x pipeline 2 over the nodes;
- the vLLM driver's argv and environment for that plan carry the Ray executor, both sizes
  and RAY_ADDRESS. vLLM itself is not started: it cannot run on logical GPUs.

Needs Ray in the vLLM environment (``tests/vllm_env.sh``): without it the test skips on a
developer's machine and fails in CI, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.drivers.vllm import build_args, build_env
from appliance.hardware.ray_cluster import read_cluster
from appliance.hardware.units import GiB
from appliance.modelfacts import ModelFacts
from appliance.planner.plan import Plan, Preferences, Variant, plan

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
L4_BYTES = 23034 << 20
NODE_ARGS = [
    "--num-cpus",
    "1",
    "--num-gpus",
    "2",
    "--resources",
    json.dumps({"accelerator_type:L4": 1}),
    "--object-store-memory",
    str(80 * 10**6),
    "--disable-usage-stats",
    "--block",
]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Ray unusable in CI: {reason}", pytrace=False)
    pytest.skip(f"Ray unusable: {reason} (run tests/vllm_env.sh {REPO / '.venv-vllm'})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _variants(family: str) -> list[Variant]:
    data = json.loads((FIXTURES / "models" / f"{family}.json").read_text())
    facts = ModelFacts.from_dict(data["facts"])
    return [
        Variant(
            family,
            v["name"],
            v["format"],
            v["quantization"],
            v["size_bytes"],
            replace(facts, format=v["format"]),
            f"/models/{family}/{v['name']}",
        )
        for v in data["variants"]
    ]


@pytest.fixture(scope="module")
def ray_bin() -> Path:
    venv = Path(os.environ.get("APPLIANCE_TEST_VLLM_VENV") or REPO / ".venv-vllm")
    ray = venv / "bin" / "ray"
    if not ray.exists():
        _unavailable(f"{ray} does not exist")
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        _unavailable(f"{venv / 'bin' / 'python'} cannot import ray: {probe.stderr.strip()[-500:]}")
    return ray


@pytest.fixture(scope="module")
def cluster(ray_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    """Head + one worker node, 2 logical L4s each; yields the head's address. Always torn down."""
    tmp = tmp_path_factory.mktemp("ray")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: str) -> None:
        with open(tmp / log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(ray_bin), "start", *args, *NODE_ARGS],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            )

    def wait_nodes(n: int) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            view = read_cluster(address, ray_bin.parent / "python")
            if view.ok and len(view.nodes) + (view.local is not None) >= n:
                return
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(1)
        logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(tmp.glob("*.log")))
        pytest.fail(f"the Ray cluster did not reach {n} node(s):\n{logs}", pytrace=False)

    try:
        start(
            [
                "--head",
                "--port",
                str(port),
                "--node-ip-address",
                "127.0.0.1",
                "--temp-dir",
                str(tmp / "t"),
                "--include-dashboard=false",
            ],
            "head.log",
        )
        wait_nodes(1)
        start(["--address", address, "--node-ip-address", "127.0.0.1"], "node.log")
        wait_nodes(2)
        yield address
    finally:
        for p in procs:  # each `ray start --block` leads a process group holding its node's processes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        gone_by = time.monotonic() + 10
        for p in procs:  # the group is empty once its last process has exited
            while time.monotonic() < gone_by:
                try:
                    os.killpg(p.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)


def test_read_plan_and_argv_against_a_real_two_node_cluster(cluster: str, ray_bin: Path) -> None:
    started = time.monotonic()
    view = read_cluster(cluster, ray_bin.parent / "python")
    read_s = time.monotonic() - started
    assert view.ok, view.error
    assert view.ray_version and view.local is not None
    assert read_s < 20, read_s
    nodes = [view.local, *view.nodes]
    assert len(nodes) == 2, [n.description for n in nodes]
    assert len({n.hostname for n in nodes}) == 2  # two nodes on one machine keep distinct names
    for node in nodes:
        assert [(g.vendor, g.name, g.memory_total, g.compute_capability) for g in node.gpus] == [
            ("nvidia", "NVIDIA L4", L4_BYTES, "8.9")
        ] * 2
        assert node.cpu.threads == 1 and node.cpu.memory_total > GiB
        assert not node.findings

    prefs = Preferences(min_context=8192, parallel=1, memory_margin=GiB, vllm_available=True, ray_address=cluster)
    variants = _variants("llama-3.1-70b")
    # One node's two L4s are not enough for vLLM: alone, the planner falls back to llama.cpp.
    alone = plan(view.local, variants, prefs)
    assert isinstance(alone, Plan) and alone.backend == "llamacpp", alone
    split = plan(view.local, variants, replace(prefs, cluster=view.nodes))
    assert isinstance(split, Plan), split
    assert (split.backend, split.tensor_parallel_size, split.pipeline_parallel_size, split.distributed_executor) == (
        "vllm",
        2,
        2,
        "ray",
    )
    assert split.devices == tuple(f"{n.hostname}/cuda:{i}" for n in nodes for i in (0, 1))
    assert "over 2 nodes (Ray)" in split.reason

    settings = SimpleNamespace(vllm_python=ray_bin.parent / "python", ray_address=cluster, data_dir=None)
    argv = build_args(split, "/run/engine.sock", settings)
    opts = dict(zip(argv, argv[1:], strict=False))
    assert opts["--distributed-executor-backend"] == "ray"
    assert opts["--tensor-parallel-size"] == "2"
    assert opts["--pipeline-parallel-size"] == "2"
    assert opts["--model"] == "/models/llama-3.1-70b/" + split.variant
    env = build_env(split, settings, "key")
    assert env["RAY_ADDRESS"] == cluster
    assert "CUDA_VISIBLE_DEVICES" not in env  # Ray assigns each worker its GPUs


def test_an_unreachable_cluster_is_an_error_not_a_hang(ray_bin: Path) -> None:
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    view = read_cluster(address, ray_bin.parent / "python")
    took = time.monotonic() - started
    assert not view.ok and not view.nodes and view.local is None
    assert took < 25, took
    assert "GCS" in (view.error or "") or "no answer" in (view.error or ""), view.error
    assert any(f.severity == "warning" and "this box's GPUs only" in f.message for f in view.all_findings())
