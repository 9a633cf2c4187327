"""Admin-defined model aliases: set and remove, as the admin API and the console both do.

An alias names an installed variant (``support-bot`` → ``gemma-3-270m:q4_k_m``);
the target is resolved when the alias is set, so an alias always points at a
canonical ``family:variant`` name. An alias may not take the name of an
installed model or a catalog family: aliases are looked up first, so it would
quietly serve another model to clients asking for that one. ``default`` follows the ``default_model``
setting and cannot be redefined. Every change is audited and drops remembered
name resolutions, so the very next request sees it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import delete
from sqlalchemy.engine import Engine

from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import Alias
from appliance.errors import BadRequest, NotFound
from appliance.serving.names import ModelNames

ALIAS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def shadowed_model(names: ModelNames, catalog_families: Iterable[str], name: str) -> str | None:
    """What an alias called ``name`` would hide: an installed model's family or a catalog family (compared
    without case, as people read them), described for an error message; None when the name is free.

    Aliases are looked up before model names, so such an alias would silently serve another model to every
    client asking for the real one. Names with ``:`` (``family:variant``) cannot be aliases at all."""
    folded = name.lower()
    for entry in names.listing():
        if "target" not in entry and str(entry["id"]).split(":", 1)[0].lower() == folded:
            return f"the installed model `{entry['id']}`"
    if any(family.lower() == folded for family in catalog_families):
        return "a model family of the catalog"
    return None


def set_alias(
    names: ModelNames,
    db: Engine,
    audit: AuditTrail,
    actor: str,
    name: str,
    target: str,
    catalog_families: Iterable[str] = (),
) -> str:
    """Point alias ``name`` at the installed variant ``target`` names; returns the canonical target.

    ``name`` may not be an installed model's family or one of ``catalog_families`` (:func:`shadowed_model`)."""
    if name == "default":
        raise BadRequest("`default` follows the default_model setting.", param="name")
    if not ALIAS_NAME.match(name or ""):
        raise BadRequest("alias names are 1-64 letters, digits, '-' and '_'", param="name")
    shadowed = shadowed_model(names, catalog_families, name)
    if shadowed is not None:
        raise BadRequest(
            f"`{name}` is the name of {shadowed}; an alias may not hide it. Choose another name.",
            param="name",
            code="alias_shadows_model",
        )
    resolved = names.resolve(target).name
    with session(db) as s:
        s.merge(Alias(name=name, target=resolved))
        s.commit()
    names.forget()
    audit.record(actor, "alias.set", name, resolved)
    return resolved


def delete_alias(names: ModelNames, db: Engine, audit: AuditTrail, actor: str, name: str, *, must_exist: bool = False) -> bool:
    """Remove alias ``name``; returns whether there was one (NotFound when ``must_exist`` and there was not)."""
    with session(db) as s:
        removed = s.execute(delete(Alias).where(Alias.name == name)).rowcount  # type: ignore[arg-type,attr-defined]
        s.commit()
    if must_exist and not removed:
        raise NotFound(f"No alias `{name}`.")
    names.forget()
    audit.record(actor, "alias.delete", name)
    return bool(removed)
