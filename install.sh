#!/usr/bin/env bash
# Install the LLM appliance.
#
#   ./install.sh                 system mode when run as root on a systemd host, else local mode
#   ./install.sh --local         ./.venv, ./appliance-data, daemon in the foreground on 127.0.0.1:8080
#   ./install.sh --system        /opt/appliance, /var/lib/appliance, /etc/appliance, systemd service, HTTPS on
#                                all addresses with the box's own CA (its certificate's SHA-256 fingerprint is printed)
#   ./install.sh --with-vllm     also prepare a separate vLLM environment (NVIDIA GPU hosts)
#   ./install.sh --rebuild-engine  build llama.cpp again for this host's GPU (after adding a GPU or driver)
#   ./install.sh --uninstall [--purge]
#   ./install.sh --make-bundle FILE [--version-suffix S] [--wheels-from EARLIER-BUNDLE]
#                                on a connected machine: one archive with everything a box of this OS and CPU needs
#                                (wheels with llama.cpp built for this host's flavour, the default model, Debian packages,
#                                the sources, a manifest with every member's sha256); --wheels-from takes the
#                                dependencies from an earlier bundle instead of the network
#   ./install.sh --bundle FILE [--local|--system]
#                                install from such an archive with no network; a bundle whose manifest does not verify is
#                                refused (later upgrades: appliancectl upgrade --bundle FILE)
#
# llama.cpp is built for the host's accelerator: CUDA on NVIDIA, HIP on AMD with ROCm, else the
# CPU (tools/engine_build.sh --print-plan shows the choice).
# This script only bootstraps Python and the virtual environment; the rest is
# `appliancectl install`, which admins can re-run to upgrade in place.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="" with_vllm=0 uninstall=0 purge=0 rebuild_engine=0 passthrough=() make_bundle="" bundle="" version_suffix="" wheels_from=""
while [[ $# -gt 0 ]]; do
  arg="$1"; shift
  case "$arg" in
    --make-bundle) make_bundle="${1:?--make-bundle needs a file name}"; shift ;;
    --bundle) bundle="${1:?--bundle needs a file}"; shift ;;
    --version-suffix) version_suffix="${1:?--version-suffix needs a suffix such as .post1}"; shift ;;
    --wheels-from) wheels_from="$(realpath -e "${1:?--wheels-from needs a bundle}")" || exit 1; shift ;;
    --system) mode=system ;;
    --local) mode=local ;;
    --with-vllm) with_vllm=1 ;;
    --uninstall) uninstall=1 ;;
    --purge) purge=1 ;;
    --rebuild-engine) rebuild_engine=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) passthrough+=("$arg") ;;
  esac
done

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

if [[ -z "$mode" ]]; then
  if [[ $EUID -eq 0 && "$(cat /proc/1/comm 2>/dev/null)" == systemd ]]; then mode=system; else mode=local; fi
fi
if [[ $mode == system ]]; then venv=/opt/appliance/venv; else venv="$here/.venv"; fi

if [[ $uninstall -eq 1 ]]; then
  if [[ ! -x "$venv/bin/appliancectl" && $purge -eq 1 ]]; then
    # Uninstalled before with the data kept: the code is gone, so delete what `appliancectl uninstall --purge` would.
    config=""
    if [[ $mode == system ]]; then
      config=/etc/appliance/appliance.toml
      data="$(sed -n 's/^[[:space:]]*data_dir[[:space:]]*=[[:space:]]*"\(.*\)"[[:space:]]*$/\1/p' "$config" 2>/dev/null | head -n 1)"
      data="${data:-/var/lib/appliance}"
    else
      data="${APPLIANCE_DATA_DIR:-$here/appliance-data}"
    fi
    [[ "$data" == /?* && "$(realpath -m "$data")" != / ]] || die "refusing to delete the data dir '$data'"
    [[ -e "$data" || ( -n "$config" && -e "$config" ) ]] || die "no installation found at $venv and no data at $data"
    rm -rf -- "$data"
    [[ -n "$config" ]] && rm -f -- "$config"
    echo "Deleted $data."
    exit 0
  fi
  [[ -x "$venv/bin/appliancectl" ]] || die "no installation found at $venv"
  args=(uninstall --yes); [[ $purge -eq 1 ]] && args+=(--purge)
  "$venv/bin/appliancectl" "${args[@]}"
  [[ $mode == local && $purge -eq 1 ]] && rm -rf "$venv"
  exit 0
fi

if [[ $rebuild_engine -eq 1 ]]; then
  [[ -x "$venv/bin/python" ]] || die "no installation found at $venv (run ./install.sh first)"
  "$here/tools/engine_build.sh" --python "$venv/bin/python" --rebuild
  if [[ $mode == system ]]; then echo "Restart the service to use it: systemctl restart appliance"; else echo "Restart the daemon to use it."; fi
  exit 0
fi

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return
    fi
  done
}

# From a bundle: verified, unpacked into <prefix>/releases/<version>, the missing Debian packages and the venv
# installed from it alone (no network), then `appliancectl install` as below.
if [[ -n "$bundle" ]]; then
  [[ $with_vllm -eq 0 ]] || die "--with-vllm is not available from a bundle (the vLLM environment is not in it)"
  bundle="$(realpath "$bundle")"
  python="$(find_python)"
  [[ -n "$python" ]] || die "needs Python 3.11+ to read the bundle; on a minimal Debian install the bundle's own packages first:
    mkdir /tmp/appliance-debs && tar -xf $bundle -C /tmp/appliance-debs debs && dpkg -i /tmp/appliance-debs/debs/*.deb"
  release_args=()
  if [[ $mode == system ]]; then
    [[ $EUID -eq 0 ]] || die "--system needs root"
    prefix=/opt/appliance
  else
    prefix="$here/.appliance"
    [[ -e "$here/.venv" && ! -L "$here/.venv" ]] && die "$here/.venv is a venv from the sources; remove it to install from a bundle here"
    [[ $EUID -eq 0 ]] || release_args+=(--no-debs)
  fi
  say "Installing from the bundle $bundle into $prefix"
  PYTHONPATH="$here" "$python" -m appliance.release install "$bundle" --prefix "$prefix" "${release_args[@]}" ||
    die "the bundle was not installed (see above)"
  if [[ $mode == system ]]; then
    exec /opt/appliance/venv/bin/appliancectl install --system "${passthrough[@]}"
  fi
  ln -sfn .appliance/venv "$here/.venv"
  cd "$here"
  exec "$here/.venv/bin/appliancectl" install --local "${passthrough[@]}"
fi

# 1. A Python 3.11+ with venv and a compiler for llama-cpp-python.
python="$(find_python)"
need_build_tools=0
command -v cc >/dev/null && command -v cmake >/dev/null || need_build_tools=1
if [[ -z "$python" || $need_build_tools -eq 1 ]]; then
  command -v apt-get >/dev/null || die "needs Python 3.11+ with venv, a C/C++ compiler and cmake"
  [[ $EUID -eq 0 ]] || die "needs Python 3.11+, build-essential and cmake; run as root once to install them"
  say "Installing Python and build tools from the Debian/Ubuntu archive"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-dev build-essential cmake >/dev/null
  python="$(command -v python3)"
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "this system's python3 is older than 3.11"
fi

# A bundle for air-gapped boxes: built in a throwaway venv, nothing installed here.
if [[ -n "$make_bundle" ]]; then
  build="$(mktemp -d)"
  trap 'rm -rf "$build"' EXIT
  say "Making the bundle $make_bundle (build venv in $build)"
  "$python" -m venv "$build/venv"
  PYTHONPATH="$here" "$build/venv/bin/python" -m appliance.release make "$make_bundle" \
    ${version_suffix:+--version-suffix "$version_suffix"} ${wheels_from:+--wheels-from "$wheels_from"}
  exit 0
fi

# jemalloc, the daemon's C allocator (the `allocator` setting): glibc's heaps grow under a long mixed load.
jemalloc_found() {
  local d
  for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    [[ -e $d/libjemalloc.so.2 ]] && return 0
  done
  return 1
}
if ! jemalloc_found; then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    say "Installing jemalloc (libjemalloc2), the daemon's memory allocator"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq libjemalloc2 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libjemalloc2 >/dev/null; } ||
      echo "    libjemalloc2 could not be installed: the daemon uses glibc's malloc, whose heaps grow slowly under load."
  else
    echo "    libjemalloc2 is not installed: the daemon uses glibc's malloc, whose heaps grow slowly under load"
    echo "    (as root: apt-get install libjemalloc2, then restart the daemon)."
  fi
fi

# 2. The virtual environment, and llama.cpp built for this host's accelerator first (the appliance's
#    own install then finds it in place). The CPU build is kept in pip's cache, so it is built once
#    per machine; GPU builds bypass the cache (tools/engine_build.sh).
say "Preparing $venv with $("$python" --version)"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
say "Building llama.cpp (about 5 minutes on the CPU the first time, longer for a GPU)"
"$here/tools/engine_build.sh" --python "$venv/bin/python"
# The manual is built into the tree that is installed: a copy under /opt/appliance in system mode
# (the source may be read-only, a mounted medium say), the checkout itself in local mode.
if [[ $mode == system ]]; then
  mkdir -p /opt/appliance
  rm -rf /opt/appliance/src && cp -a "$here" /opt/appliance/src && rm -rf /opt/appliance/src/.venv /opt/appliance/src/.git
  say "Building the manual (served by the daemon at /docs)"
  "$here/tools/build_manual.sh" "$venv/bin/python" /opt/appliance/src
  say "Installing the appliance"
  "$venv/bin/python" -m pip install -q --upgrade /opt/appliance/src
else
  say "Building the manual (served by the daemon at /docs)"
  "$here/tools/build_manual.sh" "$venv/bin/python" "$here"
  say "Installing the appliance"
  "$venv/bin/python" -m pip install -q -e "$here"
fi

if [[ $with_vllm -eq 1 ]]; then
  vllm_venv="$(dirname "$venv")/vllm-venv"
  vllm_kind="$("$here/tools/engine_build.sh" --print-plan | sed -n 's/^vllm=//p')"
  if [[ $vllm_kind == cuda ]]; then vllm_flavour=(--gpu); else vllm_flavour=(--cpu); fi
  if [[ $vllm_kind == rocm ]]; then
    say "vLLM: no ROCm build of vLLM is available from the package registry, so none is installed."
    echo "    GGUF models run on this AMD GPU through llama.cpp (HIP build). For safetensors models, install"
    echo "    vLLM for ROCm by AMD's instructions into its own environment and set vllm_python to its interpreter."
  else
    say "Preparing the vLLM environment in $vllm_venv (${vllm_flavour[0]#--} build)"
    "$here/tests/vllm_env.sh" "${vllm_flavour[@]}" "$vllm_venv"
    export APPLIANCE_VLLM_PYTHON="$vllm_venv/bin/python"
    if [[ $mode == system ]]; then
      mkdir -p /etc/appliance
      touch /etc/appliance/appliance.toml
      grep -q '^vllm_python' /etc/appliance/appliance.toml || echo "vllm_python = \"$vllm_venv/bin/python\"" >> /etc/appliance/appliance.toml
    fi
  fi
fi

# 3. Everything else: database, default model, first admin, service.
if [[ $mode == system ]]; then
  exec "$venv/bin/appliancectl" install --system "${passthrough[@]}"
else
  cd "$here"
  exec "$venv/bin/appliancectl" install --local "${passthrough[@]}"
fi
