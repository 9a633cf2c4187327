#!/usr/bin/env bash
# Build the manual (docs/ and mkdocs.yml) into webui/manual, the package data the daemon serves at /docs.
# Usage: tools/build_manual.sh [PYTHON [TREE]]   (defaults: ./.venv/bin/python, this checkout)
# TREE is the source tree to build in (its docs/, mkdocs.yml and pyproject.toml; the site goes to
# TREE/webui/manual): install.sh builds in the copy it installs, so the source may be read-only.
# Installs the `docs` extra of pyproject.toml (mkdocs and its theme) into PYTHON's environment first,
# then builds with --strict: a broken link or anchor stops the build. Run by install.sh and test.sh
# before the appliance itself is installed, so a non-editable install packs the built site.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$here/.venv/bin/python}"
tree="${2:-$here}"

mapfile -t requirements < <("$python" - "$tree/pyproject.toml" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["docs"]))
PY
)
"$python" -m pip install -q "${requirements[@]}"

out="$tree/webui/manual"
rm -rf "$out.new"
NO_MKDOCS_2_WARNING=1 "$python" -m mkdocs build --strict --quiet --config-file "$tree/mkdocs.yml" --site-dir "$out.new"
rm -rf "$out"
mv "$out.new" "$out"
