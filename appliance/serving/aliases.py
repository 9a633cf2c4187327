"""Admin-defined model aliases: set and remove, as the admin API and the console both do.

An alias names an installed variant (``support-bot`` → ``gemma-3-270m:q4_k_m``);
the target is resolved when the alias is set, so an alias always points at a
canonical ``family:variant`` name. ``default`` follows the ``default_model``
setting and cannot be redefined. Every change is audited and drops remembered
name resolutions, so the very next request sees it.
"""

from __future__ import annotations

import re

from sqlalchemy import delete
from sqlalchemy.engine import Engine

from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import Alias
from appliance.errors import BadRequest, NotFound
from appliance.serving.names import ModelNames

ALIAS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def set_alias(names: ModelNames, db: Engine, audit: AuditTrail, actor: str, name: str, target: str) -> str:
    """Point alias ``name`` at the installed variant ``target`` names; returns the canonical target."""
    if name == "default":
        raise BadRequest("`default` follows the default_model setting.", param="name")
    if not ALIAS_NAME.match(name or ""):
        raise BadRequest("alias names are 1-64 letters, digits, '-' and '_'", param="name")
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
