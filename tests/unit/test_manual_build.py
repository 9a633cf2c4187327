"""The manual builds with mkdocs --strict (no broken link or anchor) and loads nothing from off the box."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.manualkit import DOCS, ROOT, build, off_box_references


def test_manual_builds_strictly_and_references_nothing_off_the_box(tmp_path: Path):
    site = tmp_path / "site"
    result = build(site)
    assert result.returncode == 0, result.stdout + result.stderr
    pages = sorted(site.glob("*.html"))
    assert {p.stem for p in pages} >= {p.stem for p in DOCS.glob("*.md")}  # every page of docs/ was built
    checked = [*pages, *site.rglob("*.css")]
    offenders = {str(p.relative_to(site)): refs for p in checked if (refs := off_box_references(p.read_text(errors="replace")))}
    assert not offenders, offenders
    index = (site / "index.html").read_text()
    assert "fonts.googleapis" not in index and "fonts.gstatic" not in index
    assert (site / "screenshots" / "overview.png").is_file()


def _docs_copy(tmp_path: Path) -> Path:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "mkdocs.yml"


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path):
    config = _docs_copy(tmp_path / "link")
    (config.parent / "docs" / "cli.md").open("a").write("\nSee [the upgrade guide](upgrading.md).\n")
    result = build(tmp_path / "site-link", config)
    assert result.returncode != 0 and "upgrading.md" in result.stdout + result.stderr

    config = _docs_copy(tmp_path / "anchor")
    (config.parent / "docs" / "cli.md").open("a").write("\nSee [ports](install.md#no-such-heading).\n")
    result = build(tmp_path / "site-anchor", config)
    assert result.returncode != 0 and "no-such-heading" in result.stdout + result.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path):
    config = _docs_copy(tmp_path / "orphan")
    (config.parent / "docs" / "orphan.md").write_text("# Orphan\n")
    result = build(tmp_path / "site", config)
    assert result.returncode != 0 and "orphan.md" in result.stdout + result.stderr
