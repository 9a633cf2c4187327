"""Reading the Ray cluster: the parser on recorded real output, the subprocess, and its wiring.

``ray_probe_output.txt`` is the probe's real output (Ray 2.60.0) from a cluster on one machine:
the head (2 GPUs tagged ``accelerator_type:L4``, the node the probe connected through), a
second node with 2 L4s, a node without GPUs, one with a GPU of a type Ray made up
(``XYZ-9000``), and a node that had died.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from appliance.hardware.ray_cluster import ACCELERATORS, PROBE_MARK, describe, parse_probe_output, read_cluster
from appliance.hardware.units import GiB
from appliance.modelfacts import ModelFacts
from appliance.planner import service
from appliance.planner.plan import Plan, Preferences, Variant, plan
from appliance.settings import Settings

HERE = Path(__file__).resolve().parent
RECORDED = (HERE / "ray_probe_output.txt").read_text()
FIXTURES = HERE.parent / "fixtures"
L4 = 23034 << 20


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
            f"{family}/{v['name']}",
        )
        for v in data["variants"]
    ]


def test_recorded_output_becomes_snapshots() -> None:
    view = parse_probe_output("127.0.0.1:46379", RECORDED, read_at=5.0)
    assert view.ok and view.ray_version == "2.60.0" and view.read_at == 5.0
    assert view.local is not None and "a9b6b4c7" in view.local.description
    assert [(g.name, g.memory_total, g.memory_free, g.compute_capability) for g in view.local.gpus] == [
        ("NVIDIA L4", L4, L4, "8.9")
    ] * 2
    # The dead node is left out; the others follow this box, each with a distinct name.
    by_id = {n.description.split()[2][:8]: n for n in view.nodes}
    assert set(by_id) == {"e95f9b84", "420696d5", "f170fb20"}
    assert len({view.local.hostname, *(n.hostname for n in view.nodes)}) == 4
    assert [g.name for g in by_id["e95f9b84"].gpus] == ["NVIDIA L4"] * 2
    assert by_id["420696d5"].gpus == () and by_id["420696d5"].cpu.threads == 2
    assert by_id["420696d5"].cpu.memory_total == 24357153792
    unknown = by_id["f170fb20"]
    assert unknown.gpus == ()
    assert [f.severity for f in unknown.findings] == ["warning"] and "XYZ-9000" in unknown.findings[0].message
    assert "XYZ-9000" in " ".join(f.message for f in view.all_findings())
    assert "this box vm (2x NVIDIA L4, 1 CPU)" in describe(view)


def test_every_table_entry_is_a_gpu_vllm_can_plan() -> None:
    for name, acc in ACCELERATORS.items():
        assert acc.vendor in ("nvidia", "amd") and acc.memory >= 15 * GiB, name


@pytest.mark.parametrize(
    ("stdout", "error"),
    [
        ("", "printed no result"),
        (PROBE_MARK + "{not json", "invalid JSON"),
        (PROBE_MARK + json.dumps({"error": "ConnectionError: no cluster"}), "ConnectionError: no cluster"),
        (PROBE_MARK + json.dumps({"nodes": "x"}), "no node list"),
    ],
)
def test_bad_probe_output_is_an_error_view(stdout: str, error: str) -> None:
    view = parse_probe_output("h:1", stdout)
    assert not view.ok and error in (view.error or "") and view.nodes == () and view.local is None
    assert view.all_findings()[0].severity == "warning"


def test_the_recorded_cluster_plans_a_70b_model_over_two_nodes() -> None:
    view = parse_probe_output("127.0.0.1:46379", RECORDED)
    assert view.local is not None
    prefs = Preferences(
        min_context=8192,
        parallel=1,
        memory_margin=GiB,
        vllm_available=True,
        ray_address="127.0.0.1:46379",
        cluster=view.nodes,
        min_decode_tps=0,
    )
    p = plan(view.local, _variants("llama-3.1-70b"), prefs)
    assert isinstance(p, Plan)
    assert (p.variant, p.tensor_parallel_size, p.pipeline_parallel_size, p.distributed_executor) == ("fp8", 2, 2, "ray")
    # The two GPU-less nodes are skipped: the second stage is the other L4 node.
    other = next(n for n in view.nodes if n.gpus)
    assert p.devices == (
        f"{view.local.hostname}/cuda:0",
        f"{view.local.hostname}/cuda:1",
        f"{other.hostname}/cuda:0",
        f"{other.hostname}/cuda:1",
    )


def _stub(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_read_cluster_runs_the_interpreter_and_parses_its_output(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text("some Ray log line\n" + RECORDED)
    view = read_cluster("127.0.0.1:46379", _stub(tmp_path, f"cat {tmp_path / 'out.txt'}"))
    assert view.ok and len(view.nodes) == 3 and view.read_at > 0


def test_read_cluster_never_hangs_and_never_raises(tmp_path: Path) -> None:
    started = time.monotonic()
    view = read_cluster("h:1", _stub(tmp_path, "sleep 30"), timeout=1)
    assert time.monotonic() - started < 5
    assert view.error == "no answer from Ray within 1 s"
    crashed = read_cluster(
        "h:1",
        _stub(
            tmp_path,
            "echo '[2026-12-03 15:53:34,779 E 1 2] rpc_client.h:204: "
            "Failed to connect to GCS within 5 seconds. GCS may have died.' >&2; exit 1",
        ),
    )
    assert crashed.error == "the Ray probe failed: Failed to connect to GCS within 5 seconds"
    assert "could not run" in (read_cluster("h:1", tmp_path / "missing").error or "")
    no_ray = read_cluster("h:1", sys.executable)  # the appliance's own venv has no Ray
    assert not no_ray.ok and "Ray is not installed" in (no_ray.error or "")


def test_settings_reach_the_planner_doctor_and_plan_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "_clusters", {})
    (tmp_path / "out.txt").write_text(RECORDED)
    good = Settings(
        data_dir=tmp_path / "d", ray_address="127.0.0.1:46379", vllm_python=_stub(tmp_path, f"cat {tmp_path / 'out.txt'}")
    )
    sw = service.SoftwareInfo(None, (), True)
    prefs = service.preferences_for(good, sw)
    assert prefs.ray_address == "127.0.0.1:46379" and len(prefs.cluster) == 3
    assert service.cluster_view(good) is service.cluster_view(good)  # reused within the TTL
    assert service.preferences_for(Settings(data_dir=tmp_path / "d"), sw).cluster == ()

    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = Settings(data_dir=tmp_path / "d", ray_address="127.0.0.1:1", vllm_python=_stub(bad_dir, "exit 3"))
    assert service.preferences_for(bad, sw).cluster == ()
    report = service.hardware_report(bad)
    assert report["cluster"]["ok"] is False
    assert any(f["component"] == "ray" and f["severity"] == "warning" for f in report["findings"])
    snap = parse_probe_output("x", RECORDED).local
    assert snap is not None
    table = service.plan_report(snap, _variants("llama-3.2-1b"), service.preferences_for(bad, sw))
    reason = (table["plan"] or table["refusal"])["reason"]
    assert "this box only: Ray cluster at 127.0.0.1:1 could not be read" in reason
