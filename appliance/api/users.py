"""Admin API for console users: create, set a password, clear sign-in throttling.

Admin only (an admin key or the local admin socket). ``appliancectl users``
uses it; the throttling state lives in the daemon's memory, so unlocking has
to go through the daemon.
"""

from __future__ import annotations

import msgspec
from litestar import Controller, Request, post, put
from sqlalchemy.engine import Engine

from appliance.accounts.users import create_user, set_password
from appliance.api.access import Access, requires
from appliance.db.audit import AuditTrail
from appliance.jsontypes import JsonObject
from appliance.webui.context import Console, console


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


def _console(request: Request) -> Console:
    """The console's sessions and sign-in throttle, which live in the daemon's memory."""
    return console(request)


class UsersController(Controller):
    path = "/admin/users"
    opt = requires(Access.ADMIN)
    tags = ["admin: console users"]

    @post("/")
    async def create(self, data: UserCreate, db: Engine, audit: AuditTrail, actor: str) -> JsonObject:
        user = create_user(db, data.username, data.password, role=data.role, must_change_password=data.must_change_password)
        audit.record(actor, "user.create", user.username, f"role={user.role}")
        return {"username": user.username, "role": user.role, "must_change_password": user.must_change_password}

    @put("/{username:str}/password")
    async def password(
        self, request: Request, username: str, data: PasswordSet, db: Engine, audit: AuditTrail, actor: str
    ) -> JsonObject:
        user = set_password(db, username, data.password, must_change_password=data.must_change_password)
        assert user.id is not None  # set_password read the row from the database
        ended = _console(request).sessions.delete_for_user(user.id)
        audit.record(actor, "user.password_reset", user.username, f"sessions_ended={ended}")
        return {"username": user.username, "sessions_ended": ended}

    @post("/{username:str}/unlock", status_code=200)
    async def unlock(self, request: Request, username: str, data: UnlockRequest, audit: AuditTrail, actor: str) -> JsonObject:
        address = data.address
        forgotten = _console(request).throttle.unlock(username, address)
        audit.record(actor, "user.unlock", username, f"address={address} failures_forgotten={forgotten}")
        return {"username": username, "address": address, "failures_forgotten": forgotten}
