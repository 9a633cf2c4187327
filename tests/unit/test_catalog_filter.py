"""The console's catalog search: words over family and variant names, "fits this box", format."""

from appliance.catalog import load_catalog
from appliance.webui.catalog_filter import CatalogFilter
from appliance.webui.fit import Fit

FITS, NO = Fit("fits", "", ""), Fit("no", "", "")


def _matching(wanted: CatalogFilter, fit: Fit = FITS) -> set[str]:
    catalog = load_catalog()
    return {f"{f.name}:{v.name}" for f in catalog.families.values() for v in f.variants if wanted.accepts(f, v, fit)}


def test_every_word_must_match_family_or_variant():
    found = _matching(CatalogFilter(text="gemma 270m Q4"))
    assert "gemma-3-270m:q4_k_m" in found
    assert all(name.startswith("gemma-3-270m:") and "q4" in name for name in found)
    assert _matching(CatalogFilter(text="no-such-model")) == set()


def test_fits_only_and_format():
    assert _matching(CatalogFilter(fits_only=True), NO) == set()
    assert _matching(CatalogFilter(fits_only=True), Fit("tight", "", ""))
    safetensors = _matching(CatalogFilter(format="safetensors"))
    gguf = _matching(CatalogFilter(format="gguf"))
    assert safetensors and gguf and not safetensors & gguf


def test_query_parsing_ignores_unknown_formats_and_bounds_the_text():
    wanted = CatalogFilter.from_query({"q": "  qwen " + "x" * 500, "fits": "1", "format": "pickle"})
    assert wanted.text.startswith("qwen") and len(wanted.text) == 200
    assert wanted.fits_only and wanted.format == "" and wanted.active
    assert not CatalogFilter.from_query({}).active
