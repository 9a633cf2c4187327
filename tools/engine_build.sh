#!/usr/bin/env bash
# Build the llama.cpp engine library (llama-cpp-python) for this host's accelerator.
#
#   tools/engine_build.sh --print-plan                 say which flavour and how it would be built (and vLLM's
#                                                      flavour: cuda, rocm or cpu); build nothing
#   tools/engine_build.sh --python VENV/bin/python     install it into that environment (if not there yet)
#   tools/engine_build.sh --python PY --rebuild        build it again even if installed (after a GPU or driver change)
#   tools/engine_build.sh --python PY --wheel-dir DIR  build the wheel into DIR instead of installing it (for a bundle:
#                                                      install.sh --make-bundle); the flavour goes to DIR/engine.json
#
# Flavours:
#   cuda  an NVIDIA GPU (nvidia-smi on PATH, /dev/nvidia0 or /proc/driver/nvidia): -DGGML_CUDA=on with the
#         system CUDA toolkit (nvcc on PATH, $CUDACXX or /usr/local/cuda), else with nvcc, headers and
#         libraries from the registry's nvidia-cuda-*-cu12 / nvidia-cublas-cu12 wheels, installed into the venv
#   hip   an AMD GPU with ROCm (/dev/kfd and hipconfig, or /opt/rocm): -DGGML_HIP=on
#   cpu   everything else
# GPU flavours build with --no-cache-dir, so pip's cache never hands a CPU wheel to a GPU install
# (nor a GPU wheel to a later CPU one). The flavour is recorded in VENV/appliance-engine.json.
#
# Environment: APPLIANCE_ENGINE_FLAVOUR=cpu|cuda|hip forces a flavour; CMAKE_ARGS is appended to the
# flavour's own flags; APPLIANCE_HW_ROOT is prepended to /dev, /proc, /sys, /opt and /usr/local paths
# (tests describe fake machines with it).
set -euo pipefail

LLAMACPP_VERSION=0.3.36
CUDA_WHEELS=(nvidia-cuda-nvcc-cu12==12.9.* nvidia-cuda-runtime-cu12==12.9.* nvidia-cuda-cccl-cu12==12.9.* nvidia-cublas-cu12==12.9.*)
root="${APPLIANCE_HW_ROOT:-}"

print_plan=0 rebuild=0 python="" wheel_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --print-plan) print_plan=1 ;;
    --rebuild) rebuild=1 ;;
    --python) python="${2:?--python needs an interpreter}"; shift ;;
    --wheel-dir) wheel_dir="${2:?--wheel-dir needs a folder}"; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "engine_build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '==> %s\n' "$*"; }
die() { printf 'engine_build.sh: error: %s\n' "$*" >&2; exit 1; }

# -- which accelerator -------------------------------------------------------------------------
nvidia_evidence() {
  if command -v nvidia-smi >/dev/null 2>&1; then echo "nvidia-smi on PATH"; return; fi
  if [[ -e "$root/dev/nvidia0" ]]; then echo "$root/dev/nvidia0"; return; fi
  if [[ -d "$root/proc/driver/nvidia" ]]; then echo "$root/proc/driver/nvidia"; return; fi
  return 1
}

amd_gpu_present() {
  [[ -e "$root/dev/kfd" ]] && return 0
  grep -qs 0x1002 "$root"/sys/class/drm/card*/device/vendor
}

rocm_home() {
  if command -v hipconfig >/dev/null 2>&1; then hipconfig -R 2>/dev/null && return; fi
  [[ -d "$root/opt/rocm" ]] && { echo "$root/opt/rocm"; return; }
  return 1
}

flavour="" reason="" note=""
if [[ -n "${APPLIANCE_ENGINE_FLAVOUR:-}" ]]; then
  flavour="$APPLIANCE_ENGINE_FLAVOUR"; reason="APPLIANCE_ENGINE_FLAVOUR=$flavour"
  [[ $flavour == cpu || $flavour == cuda || $flavour == hip ]] || die "APPLIANCE_ENGINE_FLAVOUR must be cpu, cuda or hip"
elif evidence="$(nvidia_evidence)"; then
  flavour=cuda; reason="NVIDIA GPU ($evidence)"
elif [[ -e "$root/dev/kfd" ]] && rocm_home >/dev/null; then
  flavour=hip; reason="AMD GPU with ROCm ($root/dev/kfd, $(rocm_home))"
else
  flavour=cpu; reason="no NVIDIA GPU and no AMD GPU with ROCm"
  if amd_gpu_present; then
    note="an AMD GPU is present but ROCm is not (/dev/kfd and /opt/rocm or hipconfig): install ROCm, then ./install.sh --rebuild-engine"
  fi
fi

# vLLM's flavour follows the GPU's vendor, whatever llama.cpp is built for.
if nvidia_evidence >/dev/null; then vllm=cuda; elif amd_gpu_present; then vllm=rocm; else vllm=cpu; fi

# -- how to build it ---------------------------------------------------------------------------
cmake_args="-DGGML_NATIVE=OFF"
env_lines=()
toolkit="" pip_cache="" arch=""
if [[ $flavour == cuda ]]; then
  cmake_args+=" -DGGML_CUDA=on"
  nvcc=""
  for candidate in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null || true)" "$root/usr/local/cuda/bin/nvcc"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then nvcc="$candidate"; break; fi
  done
  if [[ -n "$nvcc" ]]; then
    toolkit="system:$nvcc"
    env_lines+=("CUDACXX=$nvcc")
    cmake_args+=" -DCMAKE_CUDA_COMPILER=$nvcc"
  else
    toolkit="wheels:${CUDA_WHEELS[*]}"
    env_lines+=("CUDACXX=<venv>/cuda-toolkit/bin/nvcc" "CUDAToolkit_ROOT=<venv>/cuda-toolkit"
                "LDFLAGS=-Wl,-rpath,<site-packages>/nvidia/cuda_runtime/lib -Wl,-rpath,<site-packages>/nvidia/cublas/lib")
    cmake_args+=" -DCMAKE_CUDA_COMPILER=<venv>/cuda-toolkit/bin/nvcc -DCUDAToolkit_ROOT=<venv>/cuda-toolkit"
  fi
  # Only this box's architectures (one build takes minutes, not the tens that every architecture costs).
  if command -v nvidia-smi >/dev/null 2>&1; then
    arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd';' || true)"
  fi
  [[ -n "$arch" ]] && cmake_args+=" -DCMAKE_CUDA_ARCHITECTURES=$arch"
  pip_cache="--no-cache-dir"
elif [[ $flavour == hip ]]; then
  home="$(rocm_home || echo "$root/opt/rocm")"
  cmake_args+=" -DGGML_HIP=on"
  if command -v hipconfig >/dev/null 2>&1; then
    env_lines+=("HIPCXX=$(hipconfig -l)/clang" "HIP_PATH=$home")
  else
    env_lines+=("HIPCXX=$home/llvm/bin/clang" "HIP_PATH=$home")
  fi
  if command -v rocm_agent_enumerator >/dev/null 2>&1; then
    arch="$(rocm_agent_enumerator 2>/dev/null | grep -v '^gfx000$' | sort -u | paste -sd';' || true)"
  fi
  [[ -n "$arch" ]] && cmake_args+=" -DAMDGPU_TARGETS=$arch"
  pip_cache="--no-cache-dir"
fi
[[ -n "${CMAKE_ARGS:-}" && "${CMAKE_ARGS}" != "-DGGML_NATIVE=OFF" ]] && cmake_args+=" $CMAKE_ARGS"

if [[ $print_plan -eq 1 ]]; then
  echo "flavour=$flavour"
  echo "reason=$reason"
  [[ -n "$note" ]] && echo "note=$note"
  [[ -n "$toolkit" ]] && echo "toolkit=$toolkit"
  echo "CMAKE_ARGS=$cmake_args"
  for line in "${env_lines[@]}"; do echo "$line"; done
  echo "pip=install ${pip_cache:+$pip_cache }--no-binary llama-cpp-python llama-cpp-python==$LLAMACPP_VERSION"
  echo "vllm=$vllm"
  exit 0
fi

# -- build -------------------------------------------------------------------------------------
[[ -n "$python" ]] || die "--python VENV/bin/python is required (or --print-plan)"
venv="$(cd "$(dirname "$python")/.." && pwd)"
record="$venv/appliance-engine.json"
installed_flavour() { sed -n 's/.*"flavour": *"\([a-z]*\)".*/\1/p' "$record" 2>/dev/null; }
have="$("$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
if [[ -z "$wheel_dir" && $rebuild -eq 0 && "$have" == "$LLAMACPP_VERSION" && "$(installed_flavour)" == "$flavour" ]]; then
  say "llama-cpp-python $have ($flavour) is installed; nothing to build"
  exit 0
fi
[[ -n "$note" ]] && say "note: $note"
say "Building llama-cpp-python $LLAMACPP_VERSION for $flavour: $reason"

build_env=()
if [[ $flavour == cuda && $toolkit == wheels:* ]]; then
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  say "No system CUDA toolkit: installing nvcc, headers and libraries from the registry's CUDA wheels"
  "$python" -m pip install -q "${CUDA_WHEELS[@]}" || die "could not install ${CUDA_WHEELS[*]}"
  tk="$venv/cuda-toolkit"
  rm -rf "$tk" && mkdir -p "$tk/include" "$tk/lib64/stubs"
  nv="$site/nvidia"
  ln -s "$nv/cuda_nvcc/bin" "$tk/bin"  # nvcc.profile finds nvvm/ and include/ beside its own folder
  ln -s "$nv/cuda_nvcc/nvvm" "$tk/nvvm"
  for inc in "$nv"/cuda_nvcc/include "$nv"/cuda_runtime/include "$nv"/cuda_cccl/include "$nv"/cublas/include; do
    [[ -d "$inc" ]] || continue
    for entry in "$inc"/*; do ln -sfn "$entry" "$tk/include/$(basename "$entry")"; done
  done
  for lib in "$nv"/cuda_runtime/lib/*.so* "$nv"/cublas/lib/*.so* "$nv"/cuda_nvcc/lib/*; do
    [[ -e "$lib" ]] || continue
    ln -sfn "$lib" "$tk/lib64/$(basename "$lib")"
    unversioned="$(basename "$lib" | sed 's/\.so\..*$/.so/')"
    [[ -e "$tk/lib64/$unversioned" ]] || ln -s "$lib" "$tk/lib64/$unversioned"
  done
  driver="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
  [[ -n "$driver" ]] && ln -sfn "$driver" "$tk/lib64/stubs/libcuda.so"
  cmake_args="${cmake_args//<venv>/$venv}"
  build_env+=("CUDACXX=$tk/bin/nvcc" "CUDAToolkit_ROOT=$tk" "PATH=$tk/bin:$PATH"
              "LDFLAGS=-Wl,-rpath,$nv/cuda_runtime/lib -Wl,-rpath,$nv/cublas/lib ${LDFLAGS:-}")
else
  for line in "${env_lines[@]}"; do build_env+=("$line"); done
fi
if [[ -n "$wheel_dir" ]]; then
  # The wheel alone, for a bundle; its dependencies come with the rest of the bundle's wheels.
  pip_args=(wheel -q --no-deps --no-binary llama-cpp-python -w "$wheel_dir")
else
  pip_args=(install -q --no-binary llama-cpp-python)
  # A first install brings llama-cpp-python's dependencies (numpy, ...); a rebuild replaces the library alone.
  [[ $rebuild -eq 1 || -n "$have" ]] && pip_args+=(--force-reinstall --no-deps)
fi
[[ -n "$pip_cache" ]] && pip_args+=("$pip_cache")
pip_args+=("llama-cpp-python==$LLAMACPP_VERSION")
env "${build_env[@]}" CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
  "$python" -m pip "${pip_args[@]}" || die "building llama-cpp-python for $flavour failed (see above)"
if [[ -n "$wheel_dir" ]]; then
  printf '{"flavour": "%s", "version": "%s", "cmake_args": "%s"}\n' "$flavour" "$LLAMACPP_VERSION" "$cmake_args" > "$wheel_dir/engine.json"
  say "llama-cpp-python $LLAMACPP_VERSION ($flavour) wheel written to $wheel_dir"
  exit 0
fi

gpu="$("$python" -c 'import llama_cpp; print(str(bool(llama_cpp.llama_supports_gpu_offload())).lower())' 2>/dev/null || echo false)"
if [[ $flavour != cpu && $gpu != true ]]; then
  die "the $flavour build of llama-cpp-python loads without GPU offload (see the build log above)"
fi
printf '{"flavour": "%s", "version": "%s", "gpu_offload": %s, "cmake_args": "%s", "built_at": %s}\n' \
  "$flavour" "$LLAMACPP_VERSION" "$gpu" "$cmake_args" "$(date +%s)" > "$record"
say "llama-cpp-python $LLAMACPP_VERSION ($flavour) installed; recorded in $record"
