"""The one-namespace layout: every package folder is listed in pyproject."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {
    "appliance": "appliance",
    "appliance.drivers": "drivers",
    "appliance.webui": "webui",
    "appliance.catalog": "models",
    "appliance.systemd": "systemd",
}
DATA_ONLY = {"appliance.systemd"}  # the unit file's folder: package data, no modules


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == MAPPING
    listed = set(config["packages"])
    found = set()
    for package, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts or "static" in rel.parts or "node_modules" in rel.parts:
                continue
            found.add(".".join([package, *rel.parts]))
    assert found | DATA_ONLY == listed


def test_llama_cpp_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.replace(" ", "").startswith("llama-cpp-python==") for d in deps)
