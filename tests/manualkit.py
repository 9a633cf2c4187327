"""The manual's build and what its pages may reference, for the /docs tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INSTALLED = ROOT / "webui" / "manual"  # tools/build_manual.sh's output, served by an editable install

# Where a page or stylesheet makes the browser load or go somewhere: attributes, CSS url(), @import.
_REFERENCE = re.compile(
    r"""(?:\b(?:src|href|action|srcset|poster|data|formaction)\s*=\s*["']?|url\(\s*["']?|@import\s+["'])\s*([^"'\s>)]+)""",
    re.IGNORECASE,
)


def build(site_dir: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site_dir``; the caller checks the result."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def ensure_installed_site() -> Path:
    """The site the daemon serves: built now when ./test.sh (tools/build_manual.sh) has not built it,
    or when a page or mkdocs.yml changed since."""
    index = INSTALLED / "index.html"
    sources = [ROOT / "mkdocs.yml", *DOCS.rglob("*")]
    if not index.is_file() or max(p.stat().st_mtime for p in sources) > index.stat().st_mtime:
        result = build(INSTALLED)
        assert result.returncode == 0, result.stdout + result.stderr
    return INSTALLED


def off_box_references(text: str) -> list[str]:
    """Every reference in ``text`` that leaves the box: an absolute http(s) URL or a protocol-relative one.
    ``data:`` URIs stay on the box; an SVG's ``xmlns`` names a namespace, it is never fetched."""
    return [ref for ref in _REFERENCE.findall(text) if re.match(r"(?:https?:)?//", ref, re.IGNORECASE)]
