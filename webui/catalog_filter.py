"""The catalog's search form: free text over family and variant names, "fits this box", and format.

Read from the query string of ``/models`` and ``/models/catalog`` (htmx sends
the form there as the user types), so a filtered catalog is also a link.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from appliance.catalog import CatalogFamily, CatalogVariant
from appliance.webui.fit import Fit

FORMATS = {"gguf": "GGUF · llama.cpp", "safetensors": "safetensors · vLLM"}
MAX_QUERY = 200


@dataclass(frozen=True)
class CatalogFilter:
    text: str = ""
    fits_only: bool = False
    format: str = ""  # "" (any) or a key of FORMATS

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> CatalogFilter:
        fmt = str(query.get("format") or "")
        return cls(
            text=str(query.get("q") or "").strip()[:MAX_QUERY],
            fits_only=query.get("fits") in ("1", "on", "true"),
            format=fmt if fmt in FORMATS else "",
        )

    @property
    def active(self) -> bool:
        return bool(self.text or self.fits_only or self.format)

    def accepts(self, family: CatalogFamily, variant: CatalogVariant, fit: Fit) -> bool:
        if self.format and variant.format != self.format:
            return False
        if self.fits_only and fit.status not in ("fits", "tight"):
            return False
        haystack = " ".join((family.name, family.title, variant.name, variant.quantization, variant.format)).lower()
        return all(word in haystack for word in self.text.lower().split())
