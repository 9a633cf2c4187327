"""The README is the front door: short, two Quick-start commands, and every link it gives resolves."""

from __future__ import annotations

import re
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(markdown_file: Path) -> set[str]:
    """The heading ids mkdocs gives a page (Python-Markdown's toc slugs, as mkdocs.yml configures them)."""
    text = _FENCE.sub("", markdown_file.read_text(encoding="utf-8"))
    return {slugify(m.group(1).strip(), "-") for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_readme_is_at_most_300_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the manual in docs/ is where more goes"


def test_quick_start_is_exactly_the_two_commands():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["./install.sh", "./test.sh"]


def test_every_readme_link_resolves():
    text = _FENCE.sub("", README.read_text(encoding="utf-8"))
    links = [target for target in _LINK.findall(text) if not re.match(r"[a-z]+:", target)]
    assert len(links) >= 15  # the manual's map at least
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        file = (ROOT / path).resolve() if path else README
        missing = not file.is_relative_to(ROOT) or not file.exists()
        if missing or (anchor and (file.suffix != ".md" or anchor not in _anchors(file))):
            broken.append(target)
    assert not broken, broken


def test_every_manual_page_is_on_the_readmes_map():
    text = README.read_text(encoding="utf-8")
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = {Path(t.partition("#")[0]).name for t in _LINK.findall(text) if t.startswith("docs/")}
    assert pages <= linked, sorted(pages - linked)
