"""Model names to installed variants, resolved once per request.

A client names a model as an alias (``default``, or one an admin defined), a
family (``gemma-3-270m``) or ``family:variant``. :meth:`ModelNames.resolve`
turns that into the store's :class:`ResolvedVariant` (the installed file, its
facts, its canonical ``family:variant`` name), and every later step of the
request (permission, cache, admission, routing, load planning, settlement)
receives that object instead of resolving the name again.
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.engine import Engine

from appliance.db.engine import session
from appliance.db.tables import Alias
from appliance.errors import ModelNotFound
from appliance.jsontypes import JsonObject
from appliance.modelfacts.capabilities import capabilities
from appliance.settings import Settings
from appliance.store.store import ModelStore, ResolvedVariant

_MAX_REMEMBERED = 10_000


class ModelNames:
    """Aliases and resolutions, remembered until :meth:`forget` (after alias or store changes)."""

    def __init__(self, settings: Settings, db: Engine, store: ModelStore):
        self._settings = settings
        self._db = db
        self._store = store
        self._aliases: dict[str, str] | None = None
        self._resolved: dict[str, ResolvedVariant] = {}
        self.started_at = time.time()

    def aliases(self) -> dict[str, str]:
        if self._aliases is None:
            with session(self._db) as s:
                rows = s.execute(select(Alias)).scalars().all()
            self._aliases = {"default": self._settings.default_model, **{r.name: r.target for r in rows}}
        return self._aliases

    def forget(self) -> None:
        """Forget aliases and resolutions (after an alias, store or database change)."""
        self._aliases = None
        self._resolved.clear()

    def resolve(self, requested: str) -> ResolvedVariant:
        """The installed, ready variant ``requested`` names; raises ModelNotFound (param ``model``)."""
        found = self._resolved.get(requested)
        if found is not None:
            return found
        target = self.aliases().get(requested, requested)
        try:
            found = self._store.resolve(target)
        except ModelNotFound:
            raise ModelNotFound(f"The model `{requested}` does not exist.", param="model") from None
        if len(self._resolved) > _MAX_REMEMBERED:
            self._resolved.clear()
        self._resolved[requested] = found
        return found

    def verified(self, variant: ResolvedVariant) -> ResolvedVariant:
        """``variant`` checked again against the disk, before an engine is started on its files."""
        return self._store.resolve(variant.name)

    def listing(self) -> list[JsonObject]:
        """``/v1/models`` entries: ready variants, then aliases with their targets, each with its capabilities
        (:mod:`appliance.modelfacts.capabilities`; an alias whose target is not installed has none)."""
        ready = [v for v in self._store.list() if v.status == "ready"]
        known: dict[str, list[str]] = {}
        for v in ready:
            known[v.name] = capabilities(v.facts)
            if v.is_default:
                known.setdefault(v.family, known[v.name])
        entries: list[JsonObject] = [{"id": v.name, "created": v.created_at, "capabilities": known[v.name]} for v in ready]
        entries += [
            {"id": alias, "created": self.started_at, "target": target, "capabilities": known.get(target, [])}
            for alias, target in self.aliases().items()
        ]
        return entries
