"""Which file a /docs path may name: only one inside the built site, whatever the spelling or the symlinks.

These spellings reach the resolver directly; through the daemon the HTTP edge refuses most of them
first (tests/security/test_manual_route.py), and the resolver is the second wall.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from appliance.manual.site import ManualSite, script_hashes

PAGE = b"""<!doctype html><html><head><script>var a=1</script><script src="assets/x.js"></script>
<script id="__config" type="application/json">{"base": "."}</script></head><body><script>var b=2</script>
<script>var a=1</script></body></html>"""


@pytest.fixture
def site(tmp_path: Path) -> ManualSite:
    (tmp_path / "secret.txt").write_text("outside the site")
    root = tmp_path / "site"
    (root / "assets" / "stylesheets").mkdir(parents=True)
    (root / "index.html").write_bytes(PAGE)
    (root / "install.html").write_text("<p>install</p>")
    (root / "assets" / "stylesheets" / "main.css").write_text("body{}")
    (root / "search").mkdir()
    (root / "search" / "index.html").write_text("search")
    (root / ".hidden").write_text("dot file")
    os.symlink(tmp_path / "secret.txt", root / "link-out.html")
    os.symlink(root / "loop-b", root / "loop-a")
    os.symlink(root / "loop-a", root / "loop-b")
    os.symlink(root / "install.html", root / "link-in.html")
    return ManualSite(root)


def test_files_inside_the_site_are_found(site: ManualSite):
    root = site.root.resolve()
    assert site.find("/") == root / "index.html"
    assert site.find("/install.html") == root / "install.html"
    assert site.find("/assets/stylesheets/main.css") == root / "assets" / "stylesheets" / "main.css"
    assert site.find("/search/") == root / "search" / "index.html"
    assert site.find("/search") == root / "search" / "index.html"
    assert site.find("/link-in.html") == root / "install.html"


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/assets/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/..%2fsecret.txt",
        "/..\\secret.txt",
        "/assets/..\\..\\secret.txt",
        "//secret.txt",
        "/./install.html",
        "/install.html\x00.css",
        "/" + str(Path("/etc/passwd")),
        "/link-out.html",
        "/loop-a",
        "/.hidden",
        "/missing.html",
        "/assets/stylesheets",  # a folder without index.html
        "/index.html/",
        "/ins%74all.html",  # the route decodes once; a name with % is never a file of the site
    ],
)
def test_no_spelling_names_a_file_outside_or_a_hidden_one(site: ManualSite, path: str):
    assert site.find(path) is None


def test_policy_allows_exactly_the_pages_inline_scripts(site: ManualSite):
    page = site.find("/")
    assert page is not None
    policy = site.policy(page)
    expected = ["'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'" for body in (b"var a=1", b"var b=2")]
    assert script_hashes(PAGE) == expected  # the external script and the JSON data block are not inline code
    assert "script-src 'self' " + " ".join(expected) + ";" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    css = site.find("/assets/stylesheets/main.css")
    assert css is not None and "script-src 'self';" in site.policy(css)
