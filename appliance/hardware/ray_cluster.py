"""The Ray cluster's nodes as :class:`HardwareSnapshot` rows, read through Ray itself.

The appliance does not depend on Ray; the vLLM environment does (vLLM's Ray executor). So
the cluster is read by a short subprocess in that environment's Python
(:data:`PROBE`): it connects with ``ray.init(address=...)`` as a driver, prints
``ray.nodes()`` and the id of the node it connected through (this box) as one JSON
line, and disconnects. :func:`parse_probe_output` turns that line into snapshots; it is
pure and tested on recorded real output.

What Ray reports per node, and how it becomes a snapshot:

- GPUs: the count is the node's ``GPU`` resource. Ray reports no GPU model or memory, only
  the ``accelerator_type:<NAME>`` resource it sets on nodes with detected NVIDIA or AMD GPUs
  (``L4``, ``H100``, ``AMD-Instinct-MI300X-OAM``); :data:`ACCELERATORS` maps that name to the
  per-GPU memory and compute capability. GPUs of a type missing from the table (or without
  one) are left out of the snapshot, with a warning finding: their memory is unknown.
  Ray does not report free GPU memory either: a cluster node's GPUs count as idle
  (free = total), which is what Ray's placement groups assume too.
- CPU and memory: Ray's ``CPU`` and ``memory`` resources (the memory Ray may schedule).

:func:`read_cluster` never raises and never hangs: an unreachable cluster, a missing
Ray or a probe past its timeout gives a :class:`ClusterView` with ``error`` set and no
nodes, so plans fall back to this box alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from appliance.hardware.snapshot import CpuInfo, Finding, GpuInfo, HardwareSnapshot
from appliance.jsontypes import JsonObject

MiB = 1 << 20
GiB = 1 << 30
PROBE_MARK = "APPLIANCE_RAY_NODES "
READ_TIMEOUT_S = 20.0
"""Longest a read may take: importing Ray and connecting take about 3 s when the cluster is up;
an unreachable one makes Ray give up after its GCS connect timeouts (set to 5 s here), about 10 s."""
_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray's own defaults wait a minute and more for an unreachable GCS.
    "RAY_gcs_rpc_server_connect_timeout_s": "5",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
}


@dataclass(frozen=True)
class Accelerator:
    vendor: str
    name: str
    memory: int
    """Per GPU, in bytes: what the driver reports as total (nvidia-smi, amd-smi), where known."""
    compute_capability: str
    """NVIDIA ``major.minor``; AMD gfx target."""


def _nv(name: str, mib: int, cc: str) -> Accelerator:
    return Accelerator("nvidia", name, mib * MiB, cc)


def _amd(name: str, nbytes: int, gfx: str) -> Accelerator:
    return Accelerator("amd", name, nbytes, gfx)


ACCELERATORS: dict[str, Accelerator] = {
    # Ray's names (ray.util.accelerators): the model token of the NVIDIA name, so "A100" and
    # "H100" cover several memory sizes; the table holds the smallest, so plans never
    # count memory a card may not have. Sizes as the driver reports them (the L4, T4, H100
    # and MI300X figures match tests/fixtures/hardware).
    "T4": _nv("Tesla T4", 15360, "7.5"),
    "V100": _nv("Tesla V100 16GB", 16160, "7.0"),
    "A10G": _nv("NVIDIA A10G", 23028, "8.6"),
    "L4": _nv("NVIDIA L4", 23034, "8.9"),
    "L40S": _nv("NVIDIA L40S", 46068, "8.9"),
    "A100": _nv("NVIDIA A100 40GB", 40536, "8.0"),
    "A100-40G": _nv("NVIDIA A100 40GB", 40536, "8.0"),
    "A100-80G": _nv("NVIDIA A100 80GB", 81920, "8.0"),
    "H100": _nv("NVIDIA H100 80GB", 81559, "9.0"),
    "H20": _nv("NVIDIA H20", 97871, "9.0"),
    "H200": _nv("NVIDIA H200", 143771, "9.0"),
    "B200": _nv("NVIDIA B200", 183359, "10.0"),
    "RTX-PRO-6000": _nv("NVIDIA RTX PRO 6000", 97887, "12.0"),
    "AMD-Instinct-MI210": _amd("AMD Instinct MI210", 64 * GiB, "gfx90a"),
    "AMD-Instinct-MI250X": _amd("AMD Instinct MI250X (one GCD)", 64 * GiB, "gfx90a"),
    "AMD-Instinct-MI250X-MI250": _amd("AMD Instinct MI250 (one GCD)", 64 * GiB, "gfx90a"),
    "AMD-Instinct-MI300X-OAM": _amd("AMD Instinct MI300X", 196592 * MiB, "gfx942"),
    "AMD-Instinct-MI300X-HF": _amd("AMD Instinct MI300X", 196592 * MiB, "gfx942"),
    "AMD-Instinct-MI325X-OAM": _amd("AMD Instinct MI325X", 256 * GiB, "gfx942"),
}

PROBE = f"""
import json, sys
MARK = {PROBE_MARK!r}
try:
    import ray
except ImportError as exc:
    print(MARK + json.dumps({{"error": f"Ray is not installed in {{sys.executable}} ({{exc}})"}}), flush=True)
    raise SystemExit(0)
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    out = {{"ray_version": ray.__version__, "self_node_id": ray.get_runtime_context().get_node_id(), "nodes": ray.nodes()}}
except Exception as exc:
    out = {{"error": f"{{type(exc).__name__}}: {{exc}}".strip()}}
finally:
    try:
        ray.shutdown()
    except Exception:
        pass
print(MARK + json.dumps(out, default=str), flush=True)
"""
"""Run as ``python -c PROBE ADDRESS`` by the vLLM environment's interpreter."""


@dataclass(frozen=True)
class ClusterView:
    """What a read of the cluster at ``address`` found."""

    address: str
    nodes: tuple[HardwareSnapshot, ...] = ()
    """Alive nodes other than this box (the planner's ``Preferences.cluster``)."""
    local: HardwareSnapshot | None = None
    """This box as Ray sees it (the node the read connected through), when it is in the cluster."""
    error: str | None = None
    """Why the cluster could not be read; then ``nodes`` is empty."""
    ray_version: str | None = None
    read_at: float = 0.0
    findings: tuple[Finding, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.error is None

    def all_findings(self) -> tuple[Finding, ...]:
        """The read's own findings and each node's (GPUs of an unknown type)."""
        head = (
            [
                Finding(
                    "ray",
                    "warning",
                    f"Ray cluster at {self.address} could not be read: {self.error}; plans use this box's GPUs only",
                    "start the cluster (ray start --head on this box) or fix ray_address",
                )
            ]
            if self.error
            else []
        )
        return (*head, *self.findings, *(f for n in self.nodes for f in n.findings))

    def to_dict(self) -> JsonObject:
        return {
            "address": self.address,
            "ok": self.ok,
            "error": self.error,
            "ray_version": self.ray_version,
            "read_at": self.read_at,
            "local": self.local.to_dict() if self.local else None,
            "nodes": [n.to_dict() for n in self.nodes],
        }


def _num(resources: JsonObject, key: str) -> float:
    value = resources.get(key, 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def node_snapshot(node: JsonObject) -> HardwareSnapshot:
    """One entry of ``ray.nodes()`` as a snapshot (see the module doc for what is assumed)."""
    resources = node.get("Resources") or {}
    if not isinstance(resources, dict):
        resources = {}
    address = str(node.get("NodeManagerAddress") or "")
    node_id = str(node.get("NodeID") or "")
    hostname = str(node.get("NodeManagerHostname") or address or node_id[:12])
    cpus = max(1, int(_num(resources, "CPU")))
    memory = int(_num(resources, "memory"))
    count = int(_num(resources, "GPU"))
    types = sorted(k.removeprefix("accelerator_type:") for k in resources if k.startswith("accelerator_type:"))
    findings: list[Finding] = []
    gpus: list[GpuInfo] = []
    known = ACCELERATORS.get(types[0]) if types else None
    if count and known is None:
        what = (
            f"of type {types[0]!r}, which the appliance's table does not know"
            if types
            else "of unknown type (Ray set no accelerator_type)"
        )
        findings.append(
            Finding(
                "ray",
                "warning",
                f"Ray node {node_id[:8]} ({hostname}, {address}) has {count} GPU(s) {what}: plans do not use them",
                "add the GPU to appliance/hardware/ray_cluster.py's ACCELERATORS",
            )
        )
    elif count and known is not None:
        gpus = [
            GpuInfo(
                index=i,
                vendor=known.vendor,
                name=known.name,
                memory_total=known.memory,
                memory_free=known.memory,
                memory_used=0,
                compute_capability=known.compute_capability,
                rocm=known.vendor == "amd",
            )
            for i in range(count)
        ]
    cpu = CpuInfo(model="unknown (Ray node)", physical_cores=cpus, threads=cpus, memory_total=memory, memory_available=memory)
    return HardwareSnapshot(
        cpu=cpu, gpus=tuple(gpus), findings=tuple(findings), hostname=hostname, description=f"Ray node {node_id} at {address}"
    )


def _unique_hostnames(snaps: list[HardwareSnapshot]) -> list[HardwareSnapshot]:
    """Several Ray nodes on one machine share a hostname; the planner names devices by hostname."""
    seen: dict[str, int] = {}
    out = []
    for s in snaps:
        n = seen.get(s.hostname, 0)
        seen[s.hostname] = n + 1
        out.append(s if n == 0 else replace(s, hostname=f"{s.hostname}#{n + 1}"))
    return out


def parse_probe_output(address: str, stdout: str, read_at: float = 0.0) -> ClusterView:
    """The probe's output (its last marked line) as a view of the cluster. Pure; never raises."""
    lines = [line for line in stdout.splitlines() if line.startswith(PROBE_MARK)]
    if not lines:
        return ClusterView(address, error="the Ray probe printed no result", read_at=read_at)
    try:
        data = json.loads(lines[-1][len(PROBE_MARK) :])
    except ValueError as exc:
        return ClusterView(address, error=f"the Ray probe printed invalid JSON ({exc})", read_at=read_at)
    if not isinstance(data, dict):
        return ClusterView(address, error="the Ray probe printed no object", read_at=read_at)
    if data.get("error"):
        return ClusterView(address, error=str(data["error"]), read_at=read_at)
    raw = data.get("nodes")
    if not isinstance(raw, list):
        return ClusterView(address, error="the Ray probe printed no node list", read_at=read_at)
    self_id = str(data.get("self_node_id") or "")
    alive = [n for n in raw if isinstance(n, dict) and n.get("Alive", n.get("alive"))]
    # This box first: its name keeps the plain hostname.
    alive.sort(key=lambda n: (str(n.get("NodeID")) != self_id, str(n.get("NodeManagerAddress")), str(n.get("NodeID"))))
    snaps = _unique_hostnames([node_snapshot(n) for n in alive])
    local = next((s for n, s in zip(alive, snaps, strict=True) if str(n.get("NodeID")) == self_id), None)
    others = tuple(s for n, s in zip(alive, snaps, strict=True) if str(n.get("NodeID")) != self_id)
    return ClusterView(
        address, nodes=others, local=local, ray_version=str(data.get("ray_version") or "") or None, read_at=read_at
    )


def _first_sentence(line: str) -> str:
    """``[2026-… E 473 474] rpc_client.h:204: Failed to connect to GCS within 5 seconds. GCS may…`` → ``Failed … seconds``."""
    text = re.sub(r"^\[[^\]]*\]\s*[\w./-]+:\d+:\s*", "", line)
    return text.split(". ", 1)[0].rstrip(".")[:300]


def describe(view: ClusterView) -> str:
    """One line for the log and ``doctor``: the nodes and their GPUs, or why there are none."""
    if view.error:
        return f"Ray cluster at {view.address} could not be read: {view.error}"

    def one(s: HardwareSnapshot) -> str:
        gpus = f"{len(s.gpus)}x {s.gpus[0].name}" if s.gpus else "no usable GPU"
        return f"{s.hostname} ({gpus}, {s.cpu.threads} CPU)"

    others = ", ".join(one(n) for n in view.nodes) or "none"
    here = one(view.local) if view.local else "not in the cluster"
    return f"Ray {view.ray_version} cluster at {view.address}: this box {here}; other nodes: {others}"


def read_cluster(address: str, python: Path | str, timeout: float = READ_TIMEOUT_S) -> ClusterView:
    """Read the cluster at ``address`` with ``python`` (the vLLM environment's). Never raises.

    The probe runs in its own process group, which is killed when it outlives ``timeout``.
    """
    now = time.time()
    env = {**os.environ, **_RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.Popen(
            [str(python), "-c", PROBE, address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return ClusterView(address, error=f"could not run {python}: {exc.strerror or exc}", read_at=now)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return ClusterView(address, error=f"no answer from Ray within {timeout:g} s", read_at=now)
    view = parse_probe_output(address, out, now)
    if view.error == "the Ray probe printed no result":
        lines = [line.strip() for line in (err or "").splitlines() if line.strip()]
        return ClusterView(
            address,
            error=f"the Ray probe failed: {_first_sentence(lines[-1]) if lines else f'exit status {proc.returncode}'}",
            read_at=now,
        )
    return view
