"""The admin forms read numbers as the admin API's body models check them, and name the refused field."""

from __future__ import annotations

import pytest
from litestar.datastructures import FormMultiDict

from appliance.api.usage import PriceUpdate
from appliance.errors import BadRequest
from appliance.store.quantize import TARGETS, targets_for
from appliance.store.variants import VariantInfo
from appliance.webui.admin_forms import field_errors, numbers, validated

FIELDS = ("input_per_m", "output_per_m", "cached_per_m")


def test_numbers_keep_empty_fields_as_none_and_whole_numbers_as_int():
    form = FormMultiDict({"input_per_m": " 2.5 ", "output_per_m": "", "cached_per_m": "3"})
    assert numbers(form, FIELDS) == {"input_per_m": 2.5, "output_per_m": None, "cached_per_m": 3}


def test_text_in_a_number_field_names_that_field_with_its_label():
    with pytest.raises(BadRequest) as info:
        numbers(FormMultiDict({"input_per_m": "ten"}), FIELDS, {"input_per_m": "Input"})
    assert info.value.param == "input_per_m" and info.value.message.startswith("Input must be a number")
    assert field_errors(info.value, "model") == {"input_per_m": info.value.message}


@pytest.mark.parametrize(
    "values, field",
    [
        ({"input_per_m": -1}, "input_per_m"),
        ({"output_per_m": float("inf")}, "output_per_m"),
        ({"cached_per_m": 1e13}, "cached_per_m"),
    ],
)
def test_the_api_body_model_refuses_what_the_api_refuses(values, field):
    with pytest.raises(BadRequest) as info:
        validated(PriceUpdate, values)
    assert info.value.param == field


def test_a_valid_body_keeps_only_the_fields_given():
    body = validated(PriceUpdate, {"input_per_m": 1000, "output_per_m": 0.5})
    assert body.model_fields_set == {"input_per_m", "output_per_m"}


def test_errors_without_a_field_fall_back_to_the_form_s_main_field():
    assert field_errors(BadRequest("no"), "model") == {"model": "no"}


def _variant(fmt: str, quantization: str | None) -> VariantInfo:
    return VariantInfo(
        id=1,
        name="fam:v",
        family="fam",
        variant="v",
        format=fmt,
        quantization=quantization,
        path="fam/v",
        size_bytes=1,
        sha256="0" * 64,
        status="ready",
        source="test",
        parent=None,
        facts={},
        is_default=False,
        pinned=False,
        created_at=0.0,
    )


def test_quantize_targets_are_those_smaller_than_the_source():
    assert targets_for(_variant("gguf", "F32")) == list(TARGETS)
    assert "f16" not in targets_for(_variant("gguf", "F16")) and "q8_0" in targets_for(_variant("gguf", "F16"))
    assert "q8_0" not in targets_for(_variant("gguf", "Q8_0")) and "q4_k_m" in targets_for(_variant("gguf", "Q8_0"))
    assert targets_for(_variant("gguf", "Q4_K_M")) == []
    assert targets_for(_variant("safetensors", "BF16")) == []
