#!/usr/bin/env bash
# Check the appliance on a GPU host, by hand (CI never runs it): about 5 minutes, 10 at most.
#
#   tests/gpu/check.sh            doctor, plans, a real daemon loading the default model on the GPU,
#                                 tokens/s at 1 and 8 streams, measured vs estimated memory and speed
#
# Uses an existing environment when there is one: $APPLIANCE_PYTHON, else this checkout's .venv,
# else an installed appliance's /opt/appliance/venv. Without one it creates .venv-gpu-check here
# (llama.cpp built for this GPU by tools/engine_build.sh; needs the package registry).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
limit="${GPU_CHECK_TIMEOUT:-600}"

usable() { [[ -x "$1" ]] && "$1" -c 'import appliance, llama_cpp, httpx' >/dev/null 2>&1; }

python=""
for candidate in "${APPLIANCE_PYTHON:-}" "$here/.venv/bin/python" /opt/appliance/venv/bin/python; do
  if [[ -n "$candidate" ]] && usable "$candidate"; then python="$candidate"; break; fi
done
if [[ -z "$python" ]]; then
  venv="$here/.venv-gpu-check"
  echo "gpu-check: no environment with the appliance found; creating $venv (needs the package registry)"
  system_python="$(command -v python3.11 || command -v python3)" || { echo "gpu-check: no python3" >&2; exit 1; }
  [[ -x "$venv/bin/python" ]] || "$system_python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$here/tools/engine_build.sh" --python "$venv/bin/python"
  "$venv/bin/python" -m pip install -q -e "$here"
  python="$venv/bin/python"
fi
echo "gpu-check: using $python"
cd "$here"
exec timeout --signal=TERM --kill-after=30 "$limit" "$python" -m tests.gpu.check "$@"
