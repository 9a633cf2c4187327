"""API keys and principals.

A key looks like ``ak_<40 url-safe chars>``. Only its sha256 is stored; the
first 12 characters are kept as a visible prefix. Lookups go by hash through a
small in-process cache that revocation and edits invalidate at once, so a
revoked key fails on the very next request.

A rotation gives a key a new secret and keeps its identity (the same row, so
quotas, budgets, usage and policies go on counting the same key); the old
secret moves to ``retired_key_secrets`` and keeps working until the end of the
overlap the admin chose, after which it is refused as rotated.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Engine, select, update
from sqlmodel import col

from appliance.accounts.lifecycle import check_expiry
from appliance.db.engine import session
from appliance.db.tables import ApiKey, RetiredSecret, Team
from appliance.errors import AuthenticationFailed, BadRequest, NotFound

KEY_PREFIX = "ak_"
MAX_TOKEN_LENGTH = 128
ROLES_KEY = ("admin", "user", "metrics")  # metrics: may read /metrics and nothing else (a Prometheus scraper)
PRIORITIES = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: an API key, a console user, or the local admin socket."""

    kind: str  # key | user | local
    id: int | None
    name: str  # for the audit log: key prefix, user name, or "local-admin"
    role: str  # admin | operator | viewer | user | metrics
    team_id: int | None = None
    priority: str = "interactive"
    allowed_models: frozenset[str] | None = None
    cache_policy: dict | None = None
    expires_at: float | None = None
    secret_until: float | None = None  # an old secret in its rotation overlap: when it stops working

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_use(self, model: str) -> bool:
        if self.allowed_models is None:
            return True
        family = model.split(":", 1)[0]
        return model in self.allowed_models or family in self.allowed_models


LOCAL_ADMIN = Principal(kind="local", id=None, name="local-admin", role="admin")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(30)


def _principal(row: ApiKey, secret_until: float | None = None) -> Principal:
    allowed = frozenset(json.loads(row.allowed_models)) if row.allowed_models else None
    return Principal(
        kind="key",
        id=row.id,
        name=row.prefix,
        role=row.role,
        team_id=row.team_id,
        priority=row.priority,
        allowed_models=allowed,
        cache_policy=json.loads(row.cache_policy) if row.cache_policy else None,
        expires_at=row.expires_at,
        secret_until=secret_until,
    )


def _unexpired(principal: Principal) -> Principal:
    """``principal``, unless its key has expired (401 ``expired_api_key``) or its secret was rotated and the overlap
    has ended (401 ``rotated_api_key``)."""
    now = time.time()
    if principal.secret_until is not None and principal.secret_until <= now:
        raise AuthenticationFailed("This API key was rotated; use the new key.", code="rotated_api_key")
    if principal.expires_at is not None and principal.expires_at <= now:
        raise AuthenticationFailed("API key has expired.", code="expired_api_key")
    return principal


class KeyRing:
    """Creates, finds and revokes API keys; caches principals by secret hash."""

    def __init__(self, db: Engine, cache_size: int = 4096):
        self._db = db
        self._cache: OrderedDict[str, Principal] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    # -- request path -------------------------------------------------------
    def remembered(self, token: str | None) -> Principal | None:
        """The principal of a key held in memory (no database work); None when it is not held.

        Raises what :meth:`authenticate` raises for a missing, malformed or expired key."""
        principal = self._cache.get(hash_token(self._well_formed(token)))
        return _unexpired(principal) if principal is not None else None

    @staticmethod
    def _well_formed(token: str | None) -> str:
        if not token:
            raise AuthenticationFailed("Missing API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key'.")
        if len(token) > MAX_TOKEN_LENGTH or not token.startswith(KEY_PREFIX) or not token.isascii():
            raise AuthenticationFailed("Invalid API key.")
        return token

    def authenticate(self, token: str | None) -> Principal:
        digest = hash_token(self._well_formed(token))
        principal = self._cache.get(digest)
        if principal is None:
            principal = self._lookup(digest)
            with self._lock:
                self._cache[digest] = principal
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return _unexpired(principal)

    def _lookup(self, digest: str) -> Principal:
        """The principal of a current secret, or of an old one (which carries the end of its overlap)."""
        secret_until = None
        with session(self._db) as s:
            row = s.execute(select(ApiKey).where(col(ApiKey.secret_hash) == digest)).scalars().first()
            stored = row.secret_hash if row is not None else None
            if row is None:
                found = s.execute(
                    select(RetiredSecret, ApiKey)
                    .join(ApiKey, col(ApiKey.id) == col(RetiredSecret.key_id))
                    .where(col(RetiredSecret.secret_hash) == digest)
                ).first()
                if found is not None:
                    old, row = found
                    stored, secret_until = old.secret_hash, old.valid_until
        if row is None or stored is None or row.revoked_at is not None or not hmac.compare_digest(stored, digest):
            raise AuthenticationFailed("Invalid API key.")
        return _principal(row, secret_until)

    def forget_all(self) -> None:
        with self._lock:
            self._cache.clear()

    def forget_key(self, key_id: int) -> None:
        with self._lock:
            for digest in [d for d, p in self._cache.items() if p.id == key_id]:
                del self._cache[digest]

    # -- administration ---------------------------------------------------------
    def create(
        self,
        name: str,
        *,
        role: str = "user",
        team_id: int | None = None,
        priority: str = "interactive",
        allowed_models: list[str] | None = None,
        expires_at: float | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns the row and the secret, which is never available again."""
        if role not in ROLES_KEY:
            raise BadRequest(f"role must be one of {', '.join(ROLES_KEY)}", param="role")
        if priority not in PRIORITIES:
            raise BadRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
        if not name or len(name) > 128:
            raise BadRequest("name must be 1 to 128 characters", param="name")
        check_expiry(expires_at, time.time())
        self._check_team(team_id)
        token = new_token()
        row = ApiKey(
            name=name,
            prefix=token[:12],
            secret_hash=hash_token(token),
            role=role,
            team_id=team_id,
            priority=priority,
            allowed_models=json.dumps(sorted(allowed_models)) if allowed_models else None,
            expires_at=expires_at,
        )
        with session(self._db) as s:
            s.add(row)
            s.commit()
            s.refresh(row)
        return row, token

    def _check_team(self, team_id: int | None) -> None:
        """A key joins only a team that exists and is not deleted."""
        if team_id is None:
            return
        with session(self._db) as s:
            team = s.get(Team, team_id)
        if team is None or team.deleted_at is not None:
            raise BadRequest("team must be one of the listed teams", param="team_id")

    def list(self, include_revoked: bool = False) -> list[ApiKey]:
        with session(self._db) as s:
            query = select(ApiKey).order_by(ApiKey.id)  # type: ignore[arg-type]
            if not include_revoked:
                query = query.where(col(ApiKey.revoked_at).is_(None))
            return list(s.execute(query).scalars())

    def get(self, key_id_or_prefix: str | int) -> ApiKey:
        with session(self._db) as s:
            if isinstance(key_id_or_prefix, int) or str(key_id_or_prefix).isdigit():
                row = s.get(ApiKey, int(key_id_or_prefix))
            else:
                prefix = str(key_id_or_prefix)
                row = s.execute(select(ApiKey).where(col(ApiKey.prefix) == prefix)).scalars().first()
                if row is None:  # the prefix of a secret a rotation replaced still names its key
                    row = (
                        s.execute(
                            select(ApiKey)
                            .join(RetiredSecret, col(RetiredSecret.key_id) == col(ApiKey.id))
                            .where(col(RetiredSecret.prefix) == prefix)
                        )
                        .scalars()
                        .first()
                    )
        if row is None:
            raise NotFound(f"No API key {key_id_or_prefix!s}.")
        return row

    def revoke(self, key_id_or_prefix: str | int) -> ApiKey:
        row = self.get(key_id_or_prefix)
        with session(self._db) as s:
            s.execute(update(ApiKey).where(col(ApiKey.id) == row.id).values(revoked_at=time.time()))
            s.commit()
        self.forget_key(row.id)  # type: ignore[arg-type]
        return self.get(row.id)  # type: ignore[arg-type]

    def update(self, key_id_or_prefix: str | int, **changes: object) -> ApiKey:
        row = self.get(key_id_or_prefix)
        values: dict[str, object] = {}
        for field in ("name", "priority", "expires_at", "team_id", "role"):
            if field in changes and changes[field] is not None:
                values[field] = changes[field]
        if "allowed_models" in changes:
            models = changes["allowed_models"]
            values["allowed_models"] = (
                json.dumps(sorted(cast("list[str]", models))) if models else None
            )  # names, checked by the API
        if "cache_policy" in changes:
            values["cache_policy"] = json.dumps(changes["cache_policy"]) if changes["cache_policy"] else None
        check_expiry(values.get("expires_at"), time.time())  # type: ignore[arg-type]
        self._check_team(values.get("team_id"))  # type: ignore[arg-type]
        if values.get("priority", "interactive") not in PRIORITIES:
            raise BadRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
        if values:
            with session(self._db) as s:
                s.execute(update(ApiKey).where(col(ApiKey.id) == row.id).values(**values))
                s.commit()
        self.forget_key(row.id)  # type: ignore[arg-type]
        return self.get(row.id)  # type: ignore[arg-type]


def token_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value:
            return value.strip()
        return None
    return x_api_key.strip() if x_api_key else None
