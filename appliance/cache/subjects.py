"""Cache policies by subject, as the admin API and the console read and change them.

A subject is the whole box (``global``), a team (by id) or a key (by id or
prefix). The global and team policies live in the cache's ``kv`` rows; a key's
lives on its row. One routine validates, stores and audits a change, so both
surfaces answer alike.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing, Principal
from appliance.accounts.labels import key_label
from appliance.cache.keys import Policy, validate_policy
from appliance.cache.responses import ResponseCache
from appliance.db.audit import AuditTrail
from appliance.db.engine import session
from appliance.db.tables import ApiKey, Team
from appliance.errors import BadRequest, NotFound
from appliance.jsontypes import JsonObject

Scope = Literal["global", "team", "key"]


@dataclass(frozen=True, slots=True)
class SubjectPolicy:
    """One subject's own policy (None: it inherits) and the policy its requests get."""

    scope: Scope
    id: int | None
    label: str
    stored: JsonObject | None
    effective: Policy

    def effective_dict(self) -> JsonObject:
        return dataclasses.asdict(self.effective)


def _team(db: Engine, team_id: int) -> Team:
    with session(db) as s:
        row = s.get(Team, team_id)
    if row is None:
        raise NotFound(f"No team {team_id}.")
    return row


def _key_principal(row: ApiKey) -> Principal:
    return Principal(
        kind="key",
        id=row.id,
        name=row.prefix,
        role=row.role,
        team_id=row.team_id,
        cache_policy=json.loads(row.cache_policy) if row.cache_policy else None,
    )


def global_policy(cache: ResponseCache) -> SubjectPolicy:
    principal = Principal(kind="local", id=None, name="global", role="admin")
    return SubjectPolicy("global", None, "global", cache.get_policy("global"), cache.policy_for(principal))


def team_policy(cache: ResponseCache, team: Team) -> SubjectPolicy:
    principal = Principal(kind="local", id=None, name=f"team:{team.name}", role="user", team_id=team.id)
    return SubjectPolicy("team", team.id, f"team:{team.name}", cache.get_policy("team", team.id), cache.policy_for(principal))


def key_policy(cache: ResponseCache, row: ApiKey) -> SubjectPolicy:
    stored = json.loads(row.cache_policy) if row.cache_policy else None
    return SubjectPolicy("key", row.id, key_label(row.name, row.prefix), stored, cache.policy_for(_key_principal(row)))


def set_subject_policy(
    cache: ResponseCache,
    keyring: KeyRing,
    db: Engine,
    audit: AuditTrail,
    actor: str,
    scope: Scope,
    ident: str | None,
    policy: JsonObject | None,
) -> tuple[int | None, JsonObject | None]:
    """Store (with None, remove) a subject's policy, audited under ``actor``; returns (subject id, policy as stored)."""
    try:
        clean = validate_policy(policy) if policy is not None else None
    except ValueError as exc:
        raise BadRequest(str(exc), param="policy") from None
    if scope == "key":
        if not ident:
            raise BadRequest("scope `key` needs an id (key id or prefix).", param="id")
        row = keyring.update(ident, cache_policy=clean)
        subject: int | None = row.id
    elif scope == "team":
        if not ident or not str(ident).isdigit():
            raise BadRequest("scope `team` needs a numeric team id.", param="id")
        subject = _team(db, int(ident)).id
        cache.set_policy("team", subject, clean)
    elif scope == "global":
        subject = None
        cache.set_policy("global", None, clean)
    else:
        raise BadRequest("scope must be global, team or key.", param="scope")
    audit.record(
        actor,
        "cache.policy",
        f"{scope}:{subject}" if subject is not None else scope,
        json.dumps(clean, sort_keys=True) if clean is not None else "removed",
    )
    return subject, clean
