"""Names for JSON as it crosses the wire.

``JsonObject`` is a decoded JSON object whose values are checked by the code
that reads them (request bodies, engine answers, stored usage and cache
entries). It is the one sanctioned ``Any`` for JSON: values arrive untyped,
and Litestar and msgspec decode handler bodies into exactly this shape.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A decoded JSON object (values unchecked until read).
JsonObject: TypeAlias = dict[str, Any]
#: Any decoded JSON value.
JsonValue: TypeAlias = Any
