#!/usr/bin/env bash
# Create the test environment and run the whole suite (slow integration,
# browser and vLLM tests included). Extra arguments go to pytest.
#
#   ./test.sh --quick   static checks and the unit tests only: no daemon, no engine
#                       process, no browser, no vLLM environment (a minute or two)
set -euo pipefail
quick=0
if [[ "${1:-}" == "--quick" ]]; then
  quick=1
  shift
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
started=$(date +%s)

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python="$(command -v "$candidate")"; break
  fi
done
[[ -n "$python" ]] || { echo "test.sh: needs Python 3.11+" >&2; exit 1; }

# System packages the tests drive for real: systemd-analyze, headless Chromium,
# a Debian root booted with systemd-nspawn for the system-mode install, and
# jemalloc, the daemon's allocator.
missing=()
command -v cmake >/dev/null || missing+=(cmake)  # llama-cpp-python builds llama.cpp from source
((quick)) || {
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v chromium >/dev/null || missing+=(chromium)
command -v promtool >/dev/null || missing+=(prometheus)  # a real Prometheus scrapes the daemon; promtool checks the shipped rules
compgen -G "/usr/lib/*/libjemalloc.so.2" >/dev/null || [[ -e /usr/lib64/libjemalloc.so.2 ]] || missing+=(libjemalloc2)
}
if ((${#missing[@]})); then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "==> apt-get install ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "test.sh: please install: ${missing[*]}" >&2
  fi
fi

[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
echo "==> building the manual (mkdocs --strict into webui/manual, served at /docs)"
tools/build_manual.sh .venv/bin/python
echo "==> pip install -e .[test] (llama-cpp-python builds once per machine, then comes from pip's cache)"
.venv/bin/python -m pip install -q -e ".[test]"

# Lint before the long run: any finding or unformatted file fails it (config in pyproject.toml's [tool.ruff]).
echo "==> ruff check and ruff format --check"
if ! .venv/bin/ruff check . || ! .venv/bin/ruff format --check .; then
  echo "test.sh: lint failed (see above); fix it, or run .venv/bin/ruff format on the files named" >&2
  exit 1
fi
# Types: mypy over the product code as the package installs it (config in pyproject.toml's [tool.mypy]).
echo "==> mypy (tools/typecheck.sh)"
if ! tools/typecheck.sh; then
  echo "test.sh: type check failed (see above)" >&2
  exit 1
fi

if ((quick)); then
  echo "==> unit tests (quick tier)"
  set +e
  export APPLIANCE_STRICT_SKIPS=1
  .venv/bin/python -m pytest -p no:cacheprovider -q tests/unit -m "not slow and not browser and not vllm" --durations=10 "$@"
  rc=$?
  set -e
  echo "==> test.sh --quick finished in $(( $(date +%s) - started )) s (pytest exit $rc)"
  [[ $rc -eq 5 ]] && { echo "test.sh: no tests ran" >&2; exit 1; }
  exit $rc
fi

if [[ -x tests/vllm_env.sh ]]; then
  echo "==> preparing the vLLM CPU environment (cached in .venv-vllm)"
  tests/vllm_env.sh "$here/.venv-vllm" || echo "test.sh: the vLLM environment could not be prepared; the vLLM tests will fail and say why" >&2
fi

echo "==> setup took $(( $(date +%s) - started )) s"
set +e
# Strict mode: a skip fails the run unless the test says why it cannot run on this machine.
export APPLIANCE_STRICT_SKIPS=1
# --durations=25: the slowest tests, so the run shows where its time goes.
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
echo "==> test.sh finished in $(( $(date +%s) - started )) s (pytest exit $rc)"
[[ $rc -eq 5 ]] && { echo "test.sh: no tests ran" >&2; exit 1; }
exit $rc
