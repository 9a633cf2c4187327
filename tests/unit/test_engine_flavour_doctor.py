"""The doctor says which llama.cpp flavour is installed, asks the library itself, and names the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.hardware.snapshot import HardwareSnapshot
from appliance.hardware.software import SoftwareInfo, probe_gpu_offload, read_engine_flavour, software_findings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hardware"


def box(name: str) -> HardwareSnapshot:
    return HardwareSnapshot.from_json((FIXTURES / f"{name}.json").read_text())


def engine_errors(sw: SoftwareInfo, snap: HardwareSnapshot) -> list:
    return [f for f in software_findings(sw, snap) if f.component == "llama.cpp" and f.severity == "error"]


def test_a_cpu_engine_beside_an_nvidia_gpu_is_an_error_with_the_rebuild_fix() -> None:
    sw = SoftwareInfo("0.3.36", (), False, engine_flavour="cpu", gpu_offload=False)
    (error,) = engine_errors(sw, box("nvidia_l4_24g"))
    assert "cpu flavour" in error.message and "NVIDIA" in error.message
    assert error.fix and "./install.sh --rebuild-engine" in error.fix


def test_the_librarys_answer_overrides_the_files() -> None:
    """A CUDA library file that does not load (no driver libraries) is still a CPU engine."""
    files_only = SoftwareInfo("0.3.36", ("cuda",), False)
    assert engine_errors(files_only, box("nvidia_l4_24g")) == []
    asked = SoftwareInfo("0.3.36", ("cuda",), False, engine_flavour="cuda", gpu_offload=False)
    assert engine_errors(asked, box("nvidia_l4_24g")) and not asked.llamacpp_gpu


def test_a_gpu_engine_beside_its_gpu_is_fine() -> None:
    sw = SoftwareInfo("0.3.36", ("cuda",), True, engine_flavour="cuda", gpu_offload=True)
    assert engine_errors(sw, box("nvidia_8xh100_80g")) == []


def test_amd_without_a_hip_engine_and_without_vllm() -> None:
    sw = SoftwareInfo("0.3.36", (), False, engine_flavour="cpu", gpu_offload=False)
    findings = software_findings(sw, box("amd_mi300x_192g"))
    (error,) = [f for f in findings if f.severity == "error"]
    assert "ROCm" in error.message and "--rebuild-engine" in (error.fix or "") and "install ROCm" in (error.fix or "")
    (vllm,) = [f for f in findings if f.component == "vllm"]
    assert "no ROCm build" in vllm.message and "vllm_python" in (vllm.fix or "")


def test_nvidia_without_vllm_points_at_the_installer() -> None:
    sw = SoftwareInfo("0.3.36", ("cuda",), False, gpu_offload=True)
    (vllm,) = [f for f in software_findings(sw, box("nvidia_l4_24g")) if f.component == "vllm"]
    assert vllm.fix and "./install.sh --with-vllm" in vllm.fix


def test_a_gpu_engine_on_a_cpu_box_is_only_information() -> None:
    sw = SoftwareInfo("0.3.36", ("cuda",), False, engine_flavour="cuda", gpu_offload=True)
    notes = [f for f in software_findings(sw, box("cpu_2core_24g")) if f.component == "llama.cpp"]
    assert [f.severity for f in notes] == ["info"]


def test_the_recorded_flavour_is_read_from_the_environment(tmp_path: Path) -> None:
    assert read_engine_flavour(tmp_path) is None
    (tmp_path / "appliance-engine.json").write_text(json.dumps({"flavour": "hip", "version": "0.3.36"}))
    assert read_engine_flavour(tmp_path) == "hip"
    (tmp_path / "appliance-engine.json").write_text("{not json")
    assert read_engine_flavour(tmp_path) is None


def test_this_boxs_library_says_it_cannot_offload() -> None:
    """The real library of this (CPU-only) test machine, asked in a child process."""
    assert probe_gpu_offload() is False
    assert probe_gpu_offload(python="/nonexistent/python") is None


def test_doctor_shows_the_flavour_and_the_librarys_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from appliance.cli import cli

    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("APPLIANCE_URL", raising=False)
    monkeypatch.delenv("APPLIANCE_CONFIG", raising=False)
    result = CliRunner().invoke(cli, ["doctor", "--json"], catch_exceptions=False)
    software = json.loads(result.output)["software"]
    assert software["llamacpp_gpu_offload"] is False and "llamacpp_flavour" in software
    text = CliRunner().invoke(cli, ["doctor"], catch_exceptions=False).output
    assert "GPU offload no" in text
