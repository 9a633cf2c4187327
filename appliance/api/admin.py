"""Admin API: instances (load, unload, pin), keys (with rotation and expiry), aliases, backup and restore. Admin only
(``appliance.api.access``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
from litestar import Controller, Request, delete, get, patch, post, put
from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing
from appliance.accounts.lifecycle import EXPIRING_SOON_DAYS, expiring_soon
from appliance.accounts.rotation import KeyLifecycle
from appliance.api.access import LOCAL_MARK, Access, requires
from appliance.db import backup as backups
from appliance.db.audit import AuditTrail
from appliance.db.tables import ApiKey
from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.serving import aliases
from appliance.serving.names import ModelNames
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.store.store import ModelStore


class KeyCreate(msgspec.Struct, kw_only=True):
    name: str
    role: str = "user"
    team_id: int | None = None
    priority: str = "interactive"
    allowed_models: list[str] | None = None
    expires_in_days: float | None = None


class KeyUpdate(msgspec.Struct, kw_only=True):
    name: str | None = None
    priority: str | None = None
    allowed_models: list[str] | None = None
    team_id: int | None = None
    expires_in_days: float | None = None


class KeyPatch(msgspec.Struct, kw_only=True):
    """Change some of a key's fields; the expiry can also be cleared (``null``: the key never expires)."""

    name: str | None = None
    priority: str | None = None
    allowed_models: list[str] | None = None
    team_id: int | None = None
    expires_at: float | None | msgspec.UnsetType = msgspec.UNSET  # epoch seconds, in the future; null clears
    expires_in_days: float | None | msgspec.UnsetType = msgspec.UNSET  # from now; null clears


class KeyRotate(msgspec.Struct, kw_only=True):
    overlap_hours: float = 24.0  # how long the old secret keeps working: 0 (refused at once) to 168 (7 days)


class AliasSet(msgspec.Struct, kw_only=True):
    target: str


def _key_view(row: ApiKey) -> JsonObject:
    return {
        "id": row.id,
        "name": row.name,
        "prefix": row.prefix,
        "role": row.role,
        "team_id": row.team_id,
        "priority": row.priority,
        "allowed_models": msgspec.json.decode(row.allowed_models) if row.allowed_models else None,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "revoked_at": row.revoked_at,
    }


class InstancesController(Controller):
    path = "/admin/instances"
    opt = requires(Access.ADMIN)
    tags = ["admin: instances"]

    @get("/")
    async def list_instances(self, router: Router) -> list[JsonObject]:
        return [i.summary() for i in router.instances.values()]

    @post("/{model:str}/load", status_code=200)
    async def load(
        self, model: str, router: Router, names: ModelNames, audit: AuditTrail, actor: str, pin: bool = False
    ) -> JsonObject:
        instance = await router.load(names.resolve(model), pin=pin or None)
        audit.record(actor, "model.load", instance.name, f"pin={pin}")
        return instance.summary()

    @post("/{model:str}/unload", status_code=200)
    async def unload(self, model: str, router: Router, names: ModelNames, audit: AuditTrail, actor: str) -> JsonObject:
        unloaded = await router.unload(names.resolve(model).name)
        audit.record(actor, "model.unload", model)
        return {"model": model, "unloaded": unloaded}

    @post("/{model:str}/pin", status_code=200)
    async def pin(
        self, model: str, router: Router, names: ModelNames, audit: AuditTrail, actor: str, pinned: bool = True
    ) -> JsonObject:
        instance = router.pin(names.resolve(model).name, pinned)
        audit.record(actor, "model.pin" if pinned else "model.unpin", instance.name)
        return instance.summary()


class KeysController(Controller):
    path = "/admin/keys"
    opt = requires(Access.ADMIN)
    tags = ["admin: keys"]

    @get("/")
    async def list_keys(self, keyring: KeyRing, include_revoked: bool = False) -> list[JsonObject]:
        return [_key_view(r) for r in keyring.list(include_revoked)]

    @post("/", status_code=201)
    async def create_key(self, data: KeyCreate, keyring: KeyRing, audit: AuditTrail, actor: str) -> JsonObject:
        expires = time.time() + data.expires_in_days * 86400 if data.expires_in_days else None
        row, secret = keyring.create(
            data.name,
            role=data.role,
            team_id=data.team_id,
            priority=data.priority,
            allowed_models=data.allowed_models,
            expires_at=expires,
        )
        audit.record(actor, "key.create", row.prefix, f"name={row.name} role={row.role}")
        return {**_key_view(row), "secret": secret}

    @put("/{key:str}", status_code=200)
    async def update_key(self, key: str, data: KeyUpdate, keyring: KeyRing, audit: AuditTrail, actor: str) -> JsonObject:
        changes: JsonObject = {f: getattr(data, f) for f in ("name", "priority", "team_id") if getattr(data, f) is not None}
        if data.allowed_models is not None:
            changes["allowed_models"] = data.allowed_models
        if data.expires_in_days is not None:
            changes["expires_at"] = time.time() + data.expires_in_days * 86400
        row = keyring.update(key, **changes)
        audit.record(actor, "key.update", row.prefix, ",".join(sorted(changes)))
        return _key_view(row)

    @patch("/{key:str}", status_code=200, sync_to_thread=True)
    def patch_key(
        self, key: str, data: KeyPatch, keyring: KeyRing, lifecycle: KeyLifecycle, audit: AuditTrail, actor: str
    ) -> JsonObject:
        """Change a key's name, priority, team or models, and set or clear its expiry (a moment in the future)."""
        if data.expires_at is not msgspec.UNSET and data.expires_in_days is not msgspec.UNSET:
            raise BadRequest("give expires_at or expires_in_days, not both", param="expires_at")
        changes: JsonObject = {f: getattr(data, f) for f in ("name", "priority", "team_id") if getattr(data, f) is not None}
        if data.allowed_models is not None:
            changes["allowed_models"] = data.allowed_models
        row = keyring.get(key)
        if data.expires_in_days is not msgspec.UNSET:
            days = data.expires_in_days
            row = lifecycle.set_expiry(row.id or 0, None if days is None else time.time() + days * 86400, "expires_in_days")
            audit.record(actor, "key.expiry", row.prefix, f"expires_at={row.expires_at}")
        elif data.expires_at is not msgspec.UNSET:
            row = lifecycle.set_expiry(row.id or 0, data.expires_at, "expires_at")
            audit.record(actor, "key.expiry", row.prefix, f"expires_at={row.expires_at}")
        if changes:
            row = keyring.update(row.id or 0, **changes)
            audit.record(actor, "key.update", row.prefix, ",".join(sorted(changes)))
        return _key_view(row)

    @post("/{key:str}/rotate", status_code=200, sync_to_thread=True)
    def rotate_key(self, key: str, data: KeyRotate, lifecycle: KeyLifecycle, audit: AuditTrail, actor: str) -> JsonObject:
        """A new secret for the same key (shown once); the old one works for ``overlap_hours``, then is refused (401)."""
        row, secret, old = lifecycle.rotate(key, data.overlap_hours)
        audit.record(actor, "key.rotate", row.prefix, f"old={old.prefix} overlap_hours={data.overlap_hours:g}")
        return {**_key_view(row), "secret": secret, "old_prefix": old.prefix, "old_valid_until": old.valid_until}

    @get("/expiring", sync_to_thread=True)
    def expiring_keys(
        self, keyring: KeyRing, lifecycle: KeyLifecycle, within_days: float = EXPIRING_SOON_DAYS
    ) -> list[JsonObject]:
        """Live keys expiring within ``within_days`` (default 14, at most 3650), and old secrets still in their rotation
        overlap."""
        if not 0 < within_days <= 3650:  # also refuses NaN
            raise BadRequest("within_days must be more than 0 and at most 3650", param="within_days")
        now = time.time()
        items = expiring_soon(keyring.list(), lifecycle.in_overlap(now), now, within_days)
        return [{"key_id": e.key_id, "label": e.label, "what": e.what, "at": e.at, "days_left": e.days_left(now)} for e in items]

    @delete("/{key:str}", status_code=200)
    async def revoke_key(self, key: str, keyring: KeyRing, audit: AuditTrail, actor: str) -> JsonObject:
        row = keyring.revoke(key)
        audit.record(actor, "key.revoke", row.prefix)
        return _key_view(row)


class AliasesController(Controller):
    path = "/admin/aliases"
    opt = requires(Access.ADMIN)
    tags = ["admin: aliases"]

    @get("/")
    async def list_aliases(self, names: ModelNames) -> dict[str, str]:
        return names.aliases()

    @put("/{name:str}", status_code=200)
    async def set_alias(
        self, name: str, data: AliasSet, names: ModelNames, store: ModelStore, db: Engine, audit: AuditTrail, actor: str
    ) -> dict[str, str]:
        target = aliases.set_alias(names, db, audit, actor, name, data.target, store.catalog.families)
        return {"name": name, "target": target}

    @delete("/{name:str}", status_code=200)
    async def delete_alias(self, name: str, names: ModelNames, db: Engine, audit: AuditTrail, actor: str) -> dict[str, str]:
        aliases.delete_alias(names, db, audit, actor, name)
        return {"name": name, "deleted": "true"}


class BackupRequest(msgspec.Struct, kw_only=True):
    name: str | None = None  # a plain file name in <data dir>/backups
    path: str | None = None  # backup: only a file directly in that folder; restore: any file from the local socket


class OpsController(Controller):
    path = "/admin/ops"
    opt = requires(Access.ADMIN)
    tags = ["admin: operations"]

    @post("/backup", status_code=200)
    async def backup(self, data: BackupRequest, settings: Settings, audit: AuditTrail, actor: str) -> JsonObject:
        folder = backups.backups_dir(settings.data_dir)
        name = data.name
        if data.path is not None:
            if name is not None:
                raise BadRequest("give `name` or `path`, not both", param="path")
            name = backups.name_from_path(data.path, folder)
        result = await asyncio.to_thread(backups.backup, settings.db_path, folder, name)
        audit.record(actor, "db.backup", result["path"])
        return result

    @post("/restore", status_code=200)
    async def restore(
        self,
        request: Request,
        data: BackupRequest,
        settings: Settings,
        after_restore: Callable[[], None],
        audit: AuditTrail,
        actor: str,
    ) -> JsonObject:
        folder = backups.backups_dir(settings.data_dir)
        source, in_backups = backups.restore_source(
            folder, name=data.name, path=data.path, local=bool(request.scope.get(LOCAL_MARK))
        )
        result = await asyncio.to_thread(backups.restore, settings.db_path, source, in_backups=in_backups)
        after_restore()
        audit.record(actor, "db.restore", result["path"])
        return result
