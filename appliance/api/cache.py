"""Admin API of the response cache: stats, purge, and cache policies of keys, teams and the whole box."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated, Literal

import msgspec
from litestar import Controller, get, post, put
from litestar.params import Parameter
from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing
from appliance.api.access import Access, requires
from appliance.cache.responses import ResponseCache
from appliance.cache.subjects import set_subject_policy
from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest, ModelNotFound
from appliance.jsontypes import JsonObject
from appliance.serving.names import ModelNames


class CachePurge(msgspec.Struct, kw_only=True):
    model: str | None = None  # family, family:variant or alias
    key: str | None = None  # key id or prefix
    all: bool = False


class CachePolicySet(msgspec.Struct, kw_only=True):
    scope: Literal["global", "team", "key"]
    id: str | None = None  # team id, or key id or prefix
    policy: JsonObject | None = None  # None removes the policy (defaults apply)


class CacheController(Controller):
    path = "/admin/cache"
    opt = requires(Access.ADMIN)
    tags = ["admin: cache"]

    @get("/stats")
    async def stats(self, cache: ResponseCache) -> JsonObject:
        return await asyncio.to_thread(cache.stats)

    @post("/purge", status_code=200)
    async def purge(
        self, data: CachePurge, cache: ResponseCache, names: ModelNames, keyring: KeyRing, audit: AuditTrail, actor: str
    ) -> JsonObject:
        if data.all == bool(data.model or data.key):
            raise BadRequest("Name a model, a key (or both), or send all: true.", param="all")
        model = key_id = None
        if data.model:
            try:
                model = names.resolve(data.model).name
            except ModelNotFound:
                model = data.model  # entries of a model no longer installed can still be purged
        if data.key:
            key_id = keyring.get(data.key).id
        purged = await asyncio.to_thread(cache.purge, model, key_id)
        target = "all" if data.all else ",".join(x for x in (model and f"model={model}", key_id and f"key={key_id}") if x)
        audit.record(actor, "cache.purge", target, f"purged={purged}")
        return {"purged": purged, "model": model, "key_id": key_id}

    @get("/policy")
    async def get_policy(
        self,
        cache: ResponseCache,
        keyring: KeyRing,
        policy_scope: Annotated[str, Parameter(query="scope")] = "global",  # `scope` is reserved by Litestar
        ident: Annotated[str | None, Parameter(query="id")] = None,
    ) -> JsonObject:
        defaults = dataclasses.asdict(cache.base_policy())
        if policy_scope == "key":
            if not ident:
                raise BadRequest("scope `key` needs an id (key id or prefix).", param="id")
            row = keyring.get(ident)
            stored = json.loads(row.cache_policy) if row.cache_policy else None
            return {"scope": "key", "id": row.id, "policy": stored, "defaults": defaults}
        if policy_scope == "team":
            if not ident or not ident.isdigit():
                raise BadRequest("scope `team` needs a numeric team id.", param="id")
            return {"scope": "team", "id": int(ident), "policy": cache.get_policy("team", int(ident)), "defaults": defaults}
        if policy_scope != "global":
            raise BadRequest("scope must be global, team or key.", param="scope")
        return {"scope": "global", "id": None, "policy": cache.get_policy("global"), "defaults": defaults}

    @put("/policy", status_code=200)
    async def set_policy(
        self, data: CachePolicySet, cache: ResponseCache, keyring: KeyRing, db: Engine, audit: AuditTrail, actor: str
    ) -> JsonObject:
        ident, clean = set_subject_policy(cache, keyring, db, audit, actor, data.scope, data.id, data.policy)
        return {"scope": data.scope, "id": ident, "policy": clean}
