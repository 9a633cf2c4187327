"""The manual's configuration reference is generated from the settings model and committed in step with it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from appliance.manual import config_reference
from appliance.manual.config_reference import PAGE, reference_page, type_name
from appliance.settings import Settings


def test_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == reference_page(), (
        "docs/configuration-reference.md differs from the settings model: run python -m appliance.manual.config_reference"
    )


def test_every_setting_has_a_row_with_its_variable_and_description():
    rows = {line.split(" | ")[0].strip("| `"): line for line in PAGE.read_text().splitlines() if line.startswith("| `")}
    assert set(rows) == set(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        assert f"`APPLIANCE_{name.upper()}`" in rows[name]
        assert field.description and field.description.replace("|", "\\|") in rows[name]


def test_a_new_setting_changes_the_page(monkeypatch):
    class Grown(Settings):
        shiny_new_knob: Literal["a", "b"] | None = Field(default=None, ge=None, description="A setting added after the page.")

    before = reference_page()
    monkeypatch.setattr(config_reference, "Settings", Grown)
    after = reference_page()
    assert after != before
    assert "| `shiny_new_knob` | `APPLIANCE_SHINY_NEW_KNOB` | one of `a`, `b` or unset | unset | A setting added after" in after


def test_check_mode_fails_on_a_stale_page_and_passes_on_a_fresh_one(tmp_path: Path, capsys):
    page = tmp_path / "configuration-reference.md"
    page.write_text(reference_page().replace("| `port` |", "| `prot` |"))
    assert config_reference.main(["--check", "--page", str(page)]) == 1
    assert "differs from the settings model" in capsys.readouterr().err
    assert config_reference.main(["--page", str(page)]) == 0
    assert config_reference.main(["--check", "--page", str(page)]) == 0


def test_types_read_as_words():
    assert type_name(int | None) == "integer or unset"
    assert type_name(list[str]) == "list of text"
    assert type_name(dict[str, Literal["admin", "viewer"]]) == "map of text to one of `admin`, `viewer`"
    with pytest.raises(TypeError, match="no reference name"):
        type_name(complex)
