"""Rotating a key's secret and changing its expiry.

A rotation gives a key a new secret and keeps its identity: the same ``api_keys`` row, so its name, team, limits,
quotas, budgets, cache policy, expiry and usage stay its own, and a daily quota is not reset. The old secret moves to
``retired_key_secrets`` and keeps working until the end of the overlap the admin chose; then it is refused with
401 ``rotated_api_key`` (see :meth:`appliance.accounts.keys.KeyRing.authenticate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, select, update
from sqlmodel import col

from appliance.accounts.keys import KeyRing, hash_token, new_token
from appliance.accounts.lifecycle import check_expiry, overlap_seconds
from appliance.db.engine import session
from appliance.db.tables import ApiKey, RetiredSecret
from appliance.errors import Conflict


class KeyLifecycle:
    """Rotation and expiry of existing keys, on a :class:`KeyRing` (whose cache each change invalidates)."""

    def __init__(self, keyring: KeyRing, db: Engine, *, after_expiry_change: Callable[[], object] | None = None):
        self._keyring = keyring
        self._db = db
        self._after_expiry_change = after_expiry_change  # the expiry alert's check: a key set to expire soon alerts at once

    def rotate(self, key_id_or_prefix: str | int, overlap_hours: float) -> tuple[ApiKey, str, RetiredSecret]:
        """Give the key a new secret; the old one keeps working for ``overlap_hours`` (0: refused at once).

        The key keeps its row, so its name, team, limits, quotas, budgets, cache policy, expiry and usage stay its own.
        Returns the key, the new secret (never available again) and the old secret's record."""
        overlap = overlap_seconds(overlap_hours)
        row = self._live(key_id_or_prefix, "rotated")
        key_id = int(row.id or 0)
        now = time.time()
        token = new_token()
        old = RetiredSecret(
            key_id=key_id, prefix=row.prefix, secret_hash=row.secret_hash, retired_at=now, valid_until=now + overlap
        )
        with session(self._db) as s:
            changed = s.execute(
                update(ApiKey)
                .where(col(ApiKey.id) == key_id, col(ApiKey.secret_hash) == row.secret_hash)
                .values(prefix=token[:12], secret_hash=hash_token(token))
            )
            if changed.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise Conflict("The key was rotated at the same moment; list the keys and try again.", code="key_changed")
            s.add(old)
            s.commit()
            s.refresh(old)
        self._keyring.forget_key(key_id)
        return self._keyring.get(key_id), token, old

    def set_expiry(self, key_id_or_prefix: str | int, expires_at: float | None, param: str = "expires_at") -> ApiKey:
        """Set the key's expiry (a moment in the future) or clear it (None: the key never expires)."""
        row = self._live(key_id_or_prefix, "changed")
        check_expiry(expires_at, time.time(), param)
        with session(self._db) as s:
            s.execute(update(ApiKey).where(col(ApiKey.id) == row.id).values(expires_at=expires_at))
            s.commit()
        self._keyring.forget_key(int(row.id or 0))
        if self._after_expiry_change is not None:
            self._after_expiry_change()
        return self._keyring.get(int(row.id or 0))

    def in_overlap(self, now: float | None = None) -> list[tuple[RetiredSecret, ApiKey]]:
        """Old secrets of live keys that still work (their overlap has not ended), with their keys."""
        with session(self._db) as s:
            rows = s.execute(
                select(RetiredSecret, ApiKey)
                .join(ApiKey, col(ApiKey.id) == col(RetiredSecret.key_id))
                .where(col(RetiredSecret.valid_until) > (time.time() if now is None else now), col(ApiKey.revoked_at).is_(None))
                .order_by(col(RetiredSecret.valid_until))
            ).all()
        return [(old, key) for old, key in rows]

    def _live(self, key_id_or_prefix: str | int, verb: str) -> ApiKey:
        row = self._keyring.get(key_id_or_prefix)
        if row.revoked_at is not None:
            raise Conflict(f"A revoked key cannot be {verb}; create a new key.", code="key_revoked")
        return row
