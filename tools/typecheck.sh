#!/usr/bin/env bash
# Type-check the product code with mypy, as the installed package lays it out.
#
# pyproject.toml maps the top-level folders drivers/, webui/, models/ and
# systemd/ into the one `appliance` namespace (appliance.drivers, ...). The
# editable install resolves that through an import hook that mypy does not run,
# so this script builds the installed layout as a tree of symbolic links in
# build/typecheck/ (the same place each run, so mypy's cache stays valid) and
# checks the `appliance` package there. Findings name the
# files by their path in that tree (appliance/drivers/... is drivers/...).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
tree="$here/build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/appliance"
for entry in "$here"/appliance/*; do ln -s "$entry" "$tree/appliance/$(basename "$entry")"; done
ln -s "$here/drivers" "$tree/appliance/drivers"
ln -s "$here/webui" "$tree/appliance/webui"
ln -s "$here/models" "$tree/appliance/catalog"
ln -s "$here/systemd" "$tree/appliance/systemd"
cd "$tree"
MYPYPATH="$tree" "$python" -m mypy --config-file "$here/pyproject.toml" --cache-dir "$here/.mypy_cache" -p appliance "$@"
