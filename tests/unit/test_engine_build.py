"""tools/engine_build.sh picks llama.cpp's flavour and build from the machine, and never mixes flavours.

Machines are fake layouts: a root folder holding dev/, proc/, sys/, opt/ (APPLIANCE_HW_ROOT) and a
folder of stand-in commands (nvidia-smi, nvcc, hipconfig, rocm_agent_enumerator) first on PATH.
The build itself is run against a stand-in interpreter that records how pip was called, so no
CUDA or HIP compiler is needed here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "engine_build.sh"
SYSTEM_PATH = "/usr/bin:/bin"  # no /usr/local/bin: the machine running the tests may have its own nvcc there


def command(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def touch(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def plan(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    full = {"PATH": f"{bin_dir}:{SYSTEM_PATH}", "APPLIANCE_HW_ROOT": str(tmp_path / "root"), "HOME": str(tmp_path)}
    full.update(env or {})
    out = subprocess.run(["bash", str(SCRIPT), "--print-plan"], env=full, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_cpu_box(tmp_path):
    p = plan(tmp_path)
    assert p["flavour"] == "cpu" and p["vllm"] == "cpu"
    assert p["CMAKE_ARGS"] == "-DGGML_NATIVE=OFF"
    assert "--no-cache-dir" not in p["pip"]  # the CPU wheel is built once per machine and cached
    assert "note" not in p and "toolkit" not in p


def test_nvidia_with_a_system_toolkit(tmp_path):
    command(tmp_path / "bin", "nvidia-smi", 'echo "9.0"; echo "9.0"')
    nvcc = command(tmp_path / "bin", "nvcc", "exit 0")
    p = plan(tmp_path)
    assert p["flavour"] == "cuda" and p["vllm"] == "cuda" and p["reason"] == "NVIDIA GPU (nvidia-smi on PATH)"
    assert p["toolkit"] == f"system:{nvcc}" and p["CUDACXX"] == str(nvcc)
    args = p["CMAKE_ARGS"].split()
    assert "-DGGML_CUDA=on" in args and f"-DCMAKE_CUDA_COMPILER={nvcc}" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in args  # only this box's GPUs
    assert "--no-cache-dir" in p["pip"].split()


@pytest.mark.parametrize("evidence", ["dev/nvidia0", "proc/driver/nvidia/version"])
def test_nvidia_without_a_toolkit_uses_the_registry_wheels(tmp_path, evidence):
    touch(tmp_path / "root", evidence)
    p = plan(tmp_path)
    assert p["flavour"] == "cuda" and p["vllm"] == "cuda"
    for wheel in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12", "nvidia-cublas-cu12"):
        assert wheel in p["toolkit"]
    assert p["toolkit"].startswith("wheels:")
    assert p["CUDACXX"] == "<venv>/cuda-toolkit/bin/nvcc" and p["CUDAToolkit_ROOT"] == "<venv>/cuda-toolkit"
    assert "-Wl,-rpath,<site-packages>/nvidia/cublas/lib" in p["LDFLAGS"]
    assert "-DCUDAToolkit_ROOT=<venv>/cuda-toolkit" in p["CMAKE_ARGS"].split()
    assert "--no-cache-dir" in p["pip"].split()


def test_nvidia_with_the_toolkit_in_usr_local_cuda(tmp_path):
    nvcc = command(tmp_path / "root" / "usr" / "local" / "cuda" / "bin", "nvcc", "exit 0")
    touch(tmp_path / "root", "dev/nvidia0")
    assert plan(tmp_path)["toolkit"] == f"system:{nvcc}"


def test_amd_with_rocm(tmp_path):
    touch(tmp_path / "root", "dev/kfd")
    (tmp_path / "root" / "opt" / "rocm").mkdir(parents=True)
    command(tmp_path / "bin", "rocm_agent_enumerator", "echo gfx000; echo gfx942")
    p = plan(tmp_path)
    rocm = tmp_path / "root" / "opt" / "rocm"
    assert p["flavour"] == "hip" and p["vllm"] == "rocm"
    assert "-DGGML_HIP=on" in p["CMAKE_ARGS"].split() and "-DAMDGPU_TARGETS=gfx942" in p["CMAKE_ARGS"].split()
    assert p["HIPCXX"] == f"{rocm}/llvm/bin/clang" and p["HIP_PATH"] == str(rocm)
    assert "--no-cache-dir" in p["pip"].split()


def test_amd_with_hipconfig(tmp_path):
    touch(tmp_path / "root", "dev/kfd")
    command(tmp_path / "bin", "hipconfig", 'case "$1" in -R) echo /opt/rocm-6.2.0;; -l) echo /opt/rocm-6.2.0/llvm/bin;; esac')
    p = plan(tmp_path)
    assert p["flavour"] == "hip" and p["HIPCXX"] == "/opt/rocm-6.2.0/llvm/bin/clang" and p["HIP_PATH"] == "/opt/rocm-6.2.0"


def test_amd_gpu_without_rocm_builds_for_the_cpu_and_says_why(tmp_path):
    touch(tmp_path / "root", "sys/class/drm/card0/device/vendor", "0x1002\n")
    p = plan(tmp_path)
    assert p["flavour"] == "cpu" and p["vllm"] == "rocm"
    assert "install ROCm" in p["note"] and "--rebuild-engine" in p["note"]


def test_forced_flavour_and_extra_cmake_args(tmp_path):
    touch(tmp_path / "root", "dev/nvidia0")
    p = plan(tmp_path, {"APPLIANCE_ENGINE_FLAVOUR": "cpu", "CMAKE_ARGS": "-DGGML_BLAS=ON"})
    assert p["flavour"] == "cpu" and p["CMAKE_ARGS"] == "-DGGML_NATIVE=OFF -DGGML_BLAS=ON"
    assert p["vllm"] == "cuda"  # vLLM still follows the GPU's vendor
    bad = subprocess.run(
        ["bash", str(SCRIPT), "--print-plan"],
        env={"PATH": SYSTEM_PATH, "APPLIANCE_ENGINE_FLAVOUR": "tpu"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0 and "cpu, cuda or hip" in bad.stderr


FAKE_PYTHON = r"""
state="$(dirname "$0")/../installed"
echo "ARGS=$* CMAKE_ARGS=${CMAKE_ARGS:-} CUDACXX=${CUDACXX:-}" >> "$(dirname "$0")/../calls.log"
case "$*" in
  *importlib.metadata*) [[ -f "$state" ]] && cat "$state"; [[ -f "$state" ]] ;;
  *llama_supports_gpu_offload*) echo "${FAKE_GPU_OFFLOAD:-false}" ;;
  *"-m pip install"*) echo 0.3.36 > "$state" ;;
esac
"""


def fake_venv(tmp_path: Path) -> Path:
    return command(tmp_path / "venv" / "bin", "python", FAKE_PYTHON)


def build(tmp_path: Path, python: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {"PATH": f"{tmp_path / 'bin'}:{SYSTEM_PATH}", "APPLIANCE_HW_ROOT": str(tmp_path / "root"), "HOME": str(tmp_path)}
    full.update(env or {})
    (tmp_path / "bin").mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", str(python), *extra], env=full, capture_output=True, text=True, timeout=30
    )


def pip_calls(tmp_path: Path) -> list[str]:
    return [line for line in (tmp_path / "venv" / "calls.log").read_text().splitlines() if "-m pip install" in line]


def test_a_gpu_build_bypasses_pips_cache_and_is_recorded(tmp_path):
    python = fake_venv(tmp_path)
    nvcc = command(tmp_path / "bin", "nvcc", "exit 0")
    touch(tmp_path / "root", "dev/nvidia0")
    done = build(tmp_path, python, env={"FAKE_GPU_OFFLOAD": "true"})
    assert done.returncode == 0, done.stderr
    (call,) = pip_calls(tmp_path)
    assert "--no-cache-dir" in call and "--no-binary llama-cpp-python" in call and "llama-cpp-python==0.3.36" in call
    assert "-DGGML_CUDA=on" in call and f"CUDACXX={nvcc}" in call
    record = json.loads((tmp_path / "venv" / "appliance-engine.json").read_text())
    assert record["flavour"] == "cuda" and record["gpu_offload"] is True
    again = build(tmp_path, python, env={"FAKE_GPU_OFFLOAD": "true"})
    assert again.returncode == 0 and "nothing to build" in again.stdout and len(pip_calls(tmp_path)) == 1


def test_a_cpu_engine_on_a_gpu_box_is_rebuilt_with_force(tmp_path):
    python = fake_venv(tmp_path)
    (tmp_path / "venv" / "installed").write_text("0.3.36\n")
    (tmp_path / "venv" / "appliance-engine.json").write_text('{"flavour": "cpu"}\n')
    command(tmp_path / "bin", "nvcc", "exit 0")
    touch(tmp_path / "root", "dev/nvidia0")
    assert build(tmp_path, python, env={"FAKE_GPU_OFFLOAD": "true"}).returncode == 0
    (call,) = pip_calls(tmp_path)
    assert "--force-reinstall" in call and "--no-cache-dir" in call


def test_a_gpu_build_without_offload_fails_loudly(tmp_path):
    python = fake_venv(tmp_path)
    command(tmp_path / "bin", "nvcc", "exit 0")
    touch(tmp_path / "root", "dev/nvidia0")
    done = build(tmp_path, python, env={"FAKE_GPU_OFFLOAD": "false"})
    assert done.returncode != 0 and "without GPU offload" in done.stderr
    assert not (tmp_path / "venv" / "appliance-engine.json").exists()


def test_cpu_build_uses_the_cache_and_rebuild_forces(tmp_path):
    python = fake_venv(tmp_path)
    assert build(tmp_path, python).returncode == 0
    assert build(tmp_path, python, "--rebuild").returncode == 0
    first, second = pip_calls(tmp_path)
    assert "--no-cache-dir" not in first and "--force-reinstall" not in first
    assert "--no-deps" not in first  # the first install brings numpy and the rest, which the offload check imports
    assert "--force-reinstall --no-deps" in second
    assert json.loads((tmp_path / "venv" / "appliance-engine.json").read_text())["flavour"] == "cpu"


def test_the_pinned_version_is_the_projects():
    from appliance.hardware.software import LLAMACPP_PIN

    pinned = re.search(r"^LLAMACPP_VERSION=(\S+)$", SCRIPT.read_text(), re.M).group(1)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"llama-cpp-python=={pinned}" in deps and pinned == LLAMACPP_PIN


def test_install_sh_builds_the_engine_first_and_offers_a_rebuild():
    text = (ROOT / "install.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "install.sh")]).returncode == 0
    assert os.access(SCRIPT, os.X_OK)
    assert text.index('tools/engine_build.sh" --python') < text.index("pip install -q -e")
    assert "--rebuild-engine) rebuild_engine=1" in text
    help_text = subprocess.run(["bash", str(ROOT / "install.sh"), "--help"], capture_output=True, text=True).stdout
    assert "--rebuild-engine" in help_text and "--with-vllm" in help_text
