"""Admin API for console users: create, set a password, clear sign-in throttling.

Admin only (an admin key or the local admin socket). ``appliancectl users``
uses it; the throttling state lives in the daemon's memory, so unlocking has
to go through the daemon.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, post, put

from appliance.api.access import Access, audit_actor, requires
from appliance.accounts.users import create_user, set_password


class UserCreate(msgspec.Struct, kw_only=True):
    username: str
    password: str
    role: str = "viewer"
    must_change_password: bool = False


class PasswordSet(msgspec.Struct, kw_only=True):
    password: str
    must_change_password: bool = False


class UnlockRequest(msgspec.Struct, kw_only=True):
    address: str | None = None


def _console(request: Request) -> Any:
    from appliance.webui.context import console

    return console(request)


class UsersController(Controller):
    path = "/admin/users"
    opt = requires(Access.ADMIN)
    tags = ["admin: console users"]

    @post("/")
    async def create(self, request: Request, data: UserCreate) -> dict[str, Any]:
        services = request.app.state.services
        user = create_user(services.db, data.username, data.password, role=data.role, must_change_password=data.must_change_password)
        services.audit(audit_actor(request), "user.create", user.username, f"role={user.role}")
        return {"username": user.username, "role": user.role, "must_change_password": user.must_change_password}

    @put("/{username:str}/password")
    async def password(self, request: Request, username: str, data: PasswordSet) -> dict[str, Any]:
        services = request.app.state.services
        user = set_password(services.db, username, data.password, must_change_password=data.must_change_password)
        ended = _console(request).sessions.delete_for_user(user.id)
        services.audit(audit_actor(request), "user.password_reset", user.username, f"sessions_ended={ended}")
        return {"username": user.username, "sessions_ended": ended}

    @post("/{username:str}/unlock", status_code=200)
    async def unlock(self, request: Request, username: str, data: UnlockRequest) -> dict[str, Any]:
        address = data.address
        forgotten = _console(request).throttle.unlock(username, address)
        request.app.state.services.audit(audit_actor(request), "user.unlock", username, f"address={address} failures_forgotten={forgotten}")
        return {"username": username, "address": address, "failures_forgotten": forgotten}
