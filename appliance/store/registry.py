"""The registry of variants: their rows in the database.

A family row holds its default variant; a variant row its format, path (relative
to the store), size, sha256, facts, parent and status (``downloading`` while it
is installed, then ``ready``, or ``corrupt`` after a failed verification). A
variant known on the hub but not downloaded is ``available``: name, quantization,
size and source, no files; it is never a family's default, and it goes when the
last installed variant of its family is removed. Files
on disk are the business of :mod:`appliance.store.installs` and
:mod:`appliance.store.store`; this module only reads and writes rows.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Callable

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from appliance.catalog import Catalog
from appliance.db import engine as dbmod
from appliance.db.tables import ModelFamily, ModelVariant
from appliance.errors import Conflict, ModelNotFound
from appliance.jsontypes import JsonObject
from appliance.store.paths import full_name, parse_name
from appliance.store.variants import AVAILABLE, AvailableVariant, VariantInfo

log = logging.getLogger("appliance.store.registry")


class VariantRegistry:
    """``VariantRegistry(db_engine, catalog)``; ``catalog()`` gives the catalog (defaults, licenses, titles)."""

    def __init__(self, db_engine: Engine, catalog: Callable[[], Catalog]):
        self.db = db_engine
        self._catalog = catalog

    # ------------------------------------------------------------ queries
    def list(self) -> list[VariantInfo]:
        with dbmod.session(self.db) as s:
            rows = s.exec(
                select(ModelVariant, ModelFamily).join(ModelFamily, col(ModelVariant.family_id) == ModelFamily.id)
            ).all()
            parents = _parent_names(s, [v for v, _ in rows])
        return sorted((_info(v, f, parents) for v, f in rows), key=lambda i: i.name)

    def get(self, name: str) -> VariantInfo:
        """The variant ``family:variant`` (or the family's default), whatever its status."""
        family, variant = parse_name(name)
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
            variant = variant or (fam.default_variant if fam else None)
            row = _variant_row(s, fam, variant) if fam and variant else None
            if row is None or fam is None:  # no family, no row
                raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
            return _info(row, fam, _parent_names(s, [row]))

    def refuse_installed(self, family: str, variant: str) -> None:
        """Conflict when ``family:variant`` is installed and ready."""
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
            row = _variant_row(s, fam, variant) if fam else None
        if row is not None and row.status == "ready":
            raise Conflict(
                f"`{family}:{variant}` is already installed; delete it first or choose another name",
                param="name",
                code="model_exists",
            )

    def unfinished(self) -> builtins.list[tuple[ModelVariant, ModelFamily]]:
        """Rows still ``downloading``, with their family."""
        with dbmod.session(self.db) as s:
            return list(
                s.exec(
                    select(ModelVariant, ModelFamily)
                    .join(ModelFamily, col(ModelVariant.family_id) == ModelFamily.id)
                    .where(ModelVariant.status == "downloading")
                ).all()
            )

    # ------------------------------------------------------------ installs
    def offer(self, family: str, offers: builtins.list[AvailableVariant]) -> builtins.list[str]:
        """Record variants known on the hub as ``available``; names already taken keep their rows. The names added."""
        if not offers:
            return []
        added = []
        with dbmod.session(self.db) as s:
            fam = self._family_row(s, family)
            assert fam.id is not None  # _family_row flushes a new row, which gives it its id
            for offer in offers:
                if _variant_row(s, fam, offer.variant) is not None:
                    continue
                s.add(
                    ModelVariant(
                        family_id=fam.id,
                        name=offer.variant,
                        format="gguf",
                        quantization=offer.quantization,
                        path="",
                        size_bytes=offer.size_bytes,
                        source=offer.source,
                        status=AVAILABLE,
                    )
                )
                added.append(full_name(family, offer.variant))
            s.commit()
        return added

    def begin(self, family: str, variant: str, *, fmt: str, source: str, path: str, parent_id: int | None = None) -> int:
        """Create (or take over) the variant's row in state ``downloading``; ``path`` is relative to the store."""
        with dbmod.session(self.db) as s:
            fam = self._family_row(s, family)
            row = _variant_row(s, fam, variant)
            if row is None:
                assert fam.id is not None  # read from (or flushed to) the database
                row = ModelVariant(family_id=fam.id, name=variant, format=fmt, path=path)
            row.format, row.path, row.source, row.status = fmt, path, source, "downloading"
            row.parent_variant_id = parent_id
            s.add(row)
            s.commit()
            assert row.id is not None
            return row.id

    def finish(self, row_id: int, *, size: int, sha256: str, facts: JsonObject) -> VariantInfo:
        """Mark an install ``ready`` with its size, hash and facts; it becomes the default when the family has none
        or the catalog names it."""
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            assert row is not None
            fam = s.get(ModelFamily, row.family_id)
            assert fam is not None
            row.size_bytes, row.sha256, row.status = size, sha256, "ready"
            row.facts = json.dumps(facts)
            row.quantization = facts.get("quant_method") or facts.get("file_type") or row.quantization
            default = _variant_row(s, fam, fam.default_variant)
            if default is None or default.status == AVAILABLE:
                fam.default_variant = row.name
            elif fam.default_variant != row.name:
                entry = self._catalog().family(fam.name)
                if entry is not None and entry.default_variant == row.name:
                    fam.default_variant = row.name
            s.add(row)
            s.add(fam)
            s.commit()
            name = full_name(fam.name, row.name)
        log.info("installed model %s (%d bytes)", name, size)
        return self.get(name)

    def drop(self, row_id: int) -> tuple[str, str] | None:
        """Drop an install's row (and its family, if that was all it had); its (family, variant), if it was there."""
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            if row is None:
                return None
            fam = s.get(ModelFamily, row.family_id)
            s.delete(row)
            s.flush()
            if fam is not None and not s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id)).first():
                s.delete(fam)
            s.commit()
        return (fam.name, row.name) if fam is not None else None

    # ------------------------------------------------------------ lifecycle
    def set_status(self, row_id: int, status: str, *, sha256: str | None = None) -> None:
        """Mark a variant ``ready`` or ``corrupt``; ``sha256`` is recorded when the row has none yet."""
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, row_id)
            if row is not None:
                row.status = status
                if sha256 is not None and row.sha256 is None:
                    row.sha256 = sha256
                s.add(row)
                s.commit()

    def remove(self, info: VariantInfo) -> None:
        """Delete a variant's row: its children lose their parent, its family goes with its last variant or gets
        another default."""
        with dbmod.session(self.db) as s:
            row = s.get(ModelVariant, info.id)
            fam = s.get(ModelFamily, row.family_id) if row else None
            for child in s.exec(select(ModelVariant).where(ModelVariant.parent_variant_id == info.id)).all():
                child.parent_variant_id = None
                s.add(child)
            if row is not None:
                s.delete(row)
                s.flush()
            if fam is not None:
                rest = s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id)).all()
                installed = [r for r in rest if r.status != AVAILABLE]
                if not installed and not info.available:  # the family's last model: what it listed goes with it
                    for other in rest:
                        s.delete(other)
                    rest = []
                if not rest:
                    s.flush()
                    s.delete(fam)
                elif fam.default_variant == info.variant or not installed:
                    fam.default_variant = self._pick_default(fam.name, [r.name for r in installed]) if installed else None
                    s.add(fam)
            s.commit()

    def set_default(self, family: str, variant: str) -> None:
        with dbmod.session(self.db) as s:
            fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).one()
            fam.default_variant = variant
            s.add(fam)
            s.commit()

    def _family_row(self, s: Session, family: str) -> ModelFamily:
        """The family's row, created (with the catalog's license and title) when it has none yet."""
        fam = s.exec(select(ModelFamily).where(ModelFamily.name == family)).first()
        if fam is None:
            entry = self._catalog().family(family)
            fam = ModelFamily(name=family, license=entry.license if entry else None, description=entry.title if entry else None)
            s.add(fam)
            s.flush()
        return fam

    def _pick_default(self, family: str, remaining: builtins.list[str]) -> str:
        entry = self._catalog().family(family)
        if entry is not None and entry.default_variant in remaining:
            return entry.default_variant
        return sorted(remaining)[0]


# ------------------------------------------------------------ rows
def _variant_row(s: Session, fam: ModelFamily | None, variant: str | None) -> ModelVariant | None:
    if fam is None or variant is None:
        return None
    return s.exec(select(ModelVariant).where(ModelVariant.family_id == fam.id, ModelVariant.name == variant)).first()


def _parent_names(s: Session, rows: list[ModelVariant]) -> dict[int, str]:
    ids = {r.parent_variant_id for r in rows if r.parent_variant_id is not None}
    if not ids:
        return {}
    found = s.exec(
        select(ModelVariant, ModelFamily)
        .join(ModelFamily, col(ModelVariant.family_id) == ModelFamily.id)
        .where(col(ModelVariant.id).in_(ids))
    ).all()
    return {v.id: full_name(f.name, v.name) for v, f in found if v.id is not None}


def _info(row: ModelVariant, fam: ModelFamily, parents: dict[int, str]) -> VariantInfo:
    assert row.id is not None  # read from the database
    return VariantInfo(
        id=row.id,
        name=full_name(fam.name, row.name),
        family=fam.name,
        variant=row.name,
        format=row.format,
        quantization=row.quantization,
        path=row.path,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        status=row.status,
        source=row.source,
        parent=parents.get(row.parent_variant_id) if row.parent_variant_id else None,
        facts=json.loads(row.facts) if row.facts else {},
        is_default=fam.default_variant == row.name,
        pinned=row.pinned,
        created_at=row.created_at,
    )
