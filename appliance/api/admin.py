"""Admin API: instances (load, unload, pin), keys and aliases. Admin role only (checked in appliance.api.edge)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, post, put
from sqlalchemy import delete as sql_delete

from appliance.db import engine as dbmod
from appliance.errors import BadRequest
from appliance.db.tables import Alias
from appliance.api.access import Access, audit_actor, requires


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


class AliasSet(msgspec.Struct, kw_only=True):
    target: str


def _key_view(row: Any) -> dict[str, Any]:
    return {
        "id": row.id, "name": row.name, "prefix": row.prefix, "role": row.role, "team_id": row.team_id,
        "priority": row.priority, "allowed_models": msgspec.json.decode(row.allowed_models) if row.allowed_models else None,
        "created_at": row.created_at, "expires_at": row.expires_at, "revoked_at": row.revoked_at,
    }




class InstancesController(Controller):
    path = "/admin/instances"
    opt = requires(Access.ADMIN)
    tags = ["admin: instances"]

    @get("/")
    async def list_instances(self, request: Request) -> list[dict[str, Any]]:
        return [i.summary() for i in request.app.state.services.router.instances.values()]

    @post("/{model:str}/load", status_code=200)
    async def load(self, request: Request, model: str, pin: bool = False) -> dict[str, Any]:
        services = request.app.state.services
        instance = await services.router.load(model, pin=pin or None)
        services.audit(audit_actor(request), "model.load", instance.name, f"pin={pin}")
        return instance.summary()

    @post("/{model:str}/unload", status_code=200)
    async def unload(self, request: Request, model: str) -> dict[str, Any]:
        services = request.app.state.services
        unloaded = await services.router.unload(model)
        services.audit(audit_actor(request), "model.unload", model)
        return {"model": model, "unloaded": unloaded}

    @post("/{model:str}/pin", status_code=200)
    async def pin(self, request: Request, model: str, pinned: bool = True) -> dict[str, Any]:
        services = request.app.state.services
        instance = services.router.pin(model, pinned)
        services.audit(audit_actor(request), "model.pin" if pinned else "model.unpin", instance.name)
        return instance.summary()


class KeysController(Controller):
    path = "/admin/keys"
    opt = requires(Access.ADMIN)
    tags = ["admin: keys"]

    @get("/")
    async def list_keys(self, request: Request, include_revoked: bool = False) -> list[dict[str, Any]]:
        return [_key_view(r) for r in request.app.state.services.keyring.list(include_revoked)]

    @post("/", status_code=201)
    async def create_key(self, request: Request, data: KeyCreate) -> dict[str, Any]:
        services = request.app.state.services
        expires = time.time() + data.expires_in_days * 86400 if data.expires_in_days else None
        row, secret = services.keyring.create(data.name, role=data.role, team_id=data.team_id, priority=data.priority,
                                              allowed_models=data.allowed_models, expires_at=expires)
        services.audit(audit_actor(request), "key.create", row.prefix, f"name={row.name} role={row.role}")
        return {**_key_view(row), "secret": secret}

    @put("/{key:str}", status_code=200)
    async def update_key(self, request: Request, key: str, data: KeyUpdate) -> dict[str, Any]:
        services = request.app.state.services
        changes: dict[str, Any] = {f: getattr(data, f) for f in ("name", "priority", "team_id") if getattr(data, f) is not None}
        if data.allowed_models is not None:
            changes["allowed_models"] = data.allowed_models
        if data.expires_in_days is not None:
            changes["expires_at"] = time.time() + data.expires_in_days * 86400
        row = services.keyring.update(key, **changes)
        services.audit(audit_actor(request), "key.update", row.prefix, ",".join(sorted(changes)))
        return _key_view(row)

    @delete("/{key:str}", status_code=200)
    async def revoke_key(self, request: Request, key: str) -> dict[str, Any]:
        services = request.app.state.services
        row = services.keyring.revoke(key)
        services.audit(audit_actor(request), "key.revoke", row.prefix)
        return _key_view(row)


class AliasesController(Controller):
    path = "/admin/aliases"
    opt = requires(Access.ADMIN)
    tags = ["admin: aliases"]

    @get("/")
    async def list_aliases(self, request: Request) -> dict[str, str]:
        return request.app.state.services.aliases()

    @put("/{name:str}", status_code=200)
    async def set_alias(self, request: Request, name: str, data: AliasSet) -> dict[str, str]:
        services = request.app.state.services
        if name == "default":
            raise BadRequest("`default` follows the default_model setting.", param="name")
        if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
            raise BadRequest("alias names are 1-64 letters, digits, '-' and '_'", param="name")
        target = services.canonical_name(data.target)
        with dbmod.session(services.db) as s:
            s.merge(Alias(name=name, target=target))
            s.commit()
        services.names_changed()
        services.audit(audit_actor(request), "alias.set", name, target)
        return {"name": name, "target": target}

    @delete("/{name:str}", status_code=200)
    async def delete_alias(self, request: Request, name: str) -> dict[str, str]:
        services = request.app.state.services
        with dbmod.session(services.db) as s:
            s.execute(sql_delete(Alias).where(Alias.name == name))  # type: ignore[arg-type]
            s.commit()
        services.names_changed()
        services.audit(audit_actor(request), "alias.delete", name)
        return {"name": name, "deleted": "true"}


class BackupRequest(msgspec.Struct, kw_only=True):
    name: str | None = None  # a plain file name in <data dir>/backups
    path: str | None = None  # backup: only a file directly in that folder; restore: any file from the local socket


class OpsController(Controller):
    path = "/admin/ops"
    opt = requires(Access.ADMIN)
    tags = ["admin: operations"]

    @post("/backup", status_code=200)
    async def backup(self, request: Request, data: BackupRequest) -> dict[str, Any]:
        import asyncio

        from appliance.db import backup as backups
        services = request.app.state.services
        folder = backups.backups_dir(services.settings.data_dir)
        name = data.name
        if data.path is not None:
            if name is not None:
                raise BadRequest("give `name` or `path`, not both", param="path")
            name = backups.name_from_path(data.path, folder)
        result = await asyncio.to_thread(backups.backup, services.settings.db_path, folder, name)
        services.audit(audit_actor(request), "db.backup", result["path"])
        return result

    @post("/restore", status_code=200)
    async def restore(self, request: Request, data: BackupRequest) -> dict[str, Any]:
        import asyncio

        from appliance.db import backup as backups
        from appliance.api.access import LOCAL_MARK

        services = request.app.state.services
        folder = backups.backups_dir(services.settings.data_dir)
        source, in_backups = backups.restore_source(folder, name=data.name, path=data.path,
                                                    local=bool(request.scope.get(LOCAL_MARK)))  # type: ignore[call-overload]
        result = await asyncio.to_thread(backups.restore, services.settings.db_path, source, in_backups=in_backups)
        services.after_restore()
        services.audit(audit_actor(request), "db.restore", result["path"])
        return result
