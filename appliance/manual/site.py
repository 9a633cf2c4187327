"""The built manual on disk, and the one file a ``/docs`` path may name.

mkdocs writes the site (``tools/build_manual.sh``) into ``appliance/webui/manual``, package data
that is not in git. :meth:`ManualSite.find` turns the path after ``/docs/`` into a file inside that
folder or nothing: every segment must be a plain name (no ``..``, ``.``, empty segment, backslash,
NUL or leading dot), and the resolved file, symlinks followed, must still lie inside the site.

The theme's pages carry a few inline scripts (its settings and colour-scheme bootstrap), which the
console's Content-Security-Policy (``script-src 'self'``) would block. :meth:`ManualSite.policy`
allows exactly those scripts by their SHA-256 hashes, page by page, and nothing else: no
``unsafe-inline``, no ``unsafe-eval``, no origin but the box's own.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)(?![^>]*\btype=\"application/json\")[^>]*>(.*?)</script>", re.S | re.I)

BASE_POLICY = (
    "default-src 'self'; script-src 'self'{scripts}; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; worker-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


def installed_site_root() -> Path:
    """Where the package keeps the built manual (it may not have been built)."""
    return Path(str(resources.files("appliance.webui"))) / "manual"


def script_hashes(html: bytes) -> list[str]:
    """The CSP source expressions (``'sha256-…'``) of a page's inline scripts, in page order, without repeats."""
    found: list[str] = []
    for match in _INLINE_SCRIPT.finditer(html):
        digest = base64.b64encode(hashlib.sha256(match.group(1)).digest()).decode("ascii")
        source = f"'sha256-{digest}'"
        if source not in found:
            found.append(source)
    return found


@dataclass
class ManualSite:
    """The built manual's folder; ``find`` and ``policy`` are safe to call with any client's path."""

    root: Path
    _policies: dict[tuple[Path, int], str] = field(default_factory=dict, repr=False)

    @property
    def built(self) -> bool:
        return (self.root / "index.html").is_file()

    def find(self, path: str) -> Path | None:
        """The file that ``path`` (relative to /docs/) names, or None. An empty path or a folder means its index.html."""
        segments = path.split("/")
        if segments and segments[-1] == "":
            segments = [*segments[:-1], "index.html"]
        if segments and segments[0] == "":
            segments = segments[1:]
        if not segments or not all(_SEGMENT.match(segment) for segment in segments):
            return None
        root = self.root.resolve()
        try:
            candidate = root.joinpath(*segments).resolve(strict=True)
        except (OSError, RuntimeError):  # missing, or a symlink loop
            return None
        if candidate.is_dir():
            candidate = candidate / "index.html"
        if not candidate.is_relative_to(root) or not candidate.is_file():
            return None
        return candidate

    def policy(self, page: Path) -> str:
        """The Content-Security-Policy for ``page``: 'self' only, plus the hashes of the page's own inline scripts."""
        key = (page, page.stat().st_mtime_ns)
        cached = self._policies.get(key)
        if cached is None:
            hashes = script_hashes(page.read_bytes()) if page.suffix == ".html" else []
            cached = BASE_POLICY.format(scripts="".join(f" {source}" for source in hashes))
            if len(self._policies) > 256:
                self._policies.clear()
            self._policies[key] = cached
        return cached
