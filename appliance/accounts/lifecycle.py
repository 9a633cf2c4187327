"""The rules of a key's life after creation: rotation overlaps, expiry changes, and what counts as expiring soon.

Pure functions of rows and a clock; :class:`appliance.accounts.keys.KeyRing` applies them, the key-expiry alert
(:mod:`appliance.metering.key_expiry`) and the console's Keys page read them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from appliance.accounts.labels import key_label
from appliance.db.tables import ApiKey, RetiredSecret
from appliance.errors import BadRequest

MAX_OVERLAP_HOURS = 7 * 24  # the longest an old secret keeps working after a rotation
EXPIRING_SOON_DAYS = 14  # the Keys page lists keys expiring within this many days
EXPIRY_ALERT_DAYS = (14, 1)  # an alert when a key comes within each of these many days of its expiry
DAY = 86400.0


def overlap_seconds(hours: float) -> float:
    """How long the old secret keeps working after a rotation: 0 (refused at once) to :data:`MAX_OVERLAP_HOURS`."""
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours):
        raise BadRequest("overlap_hours must be a number of hours", param="overlap_hours")
    if not 0 <= hours <= MAX_OVERLAP_HOURS:
        raise BadRequest(f"overlap_hours must be from 0 to {MAX_OVERLAP_HOURS} (7 days)", param="overlap_hours")
    return float(hours) * 3600.0


def check_expiry(expires_at: float | None, now: float, param: str = "expires_in_days") -> None:
    """A key's expiry, when it has one, is a real moment in the future: a key born (or set) expired is a mistake."""
    if expires_at is None:
        return
    if not math.isfinite(expires_at):
        raise BadRequest("the expiry must be a finite moment", param=param)
    if expires_at <= now:
        raise BadRequest("the expiry must be in the future", param=param)


def alert_threshold(expires_at: float | None, now: float, thresholds: Iterable[int] = EXPIRY_ALERT_DAYS) -> int | None:
    """The tightest threshold (days) a key expiring at ``expires_at`` is within now; None when it is within none, never
    expires, or has expired already (it is refused, and the Keys page says so)."""
    if expires_at is None or expires_at <= now:
        return None
    within = [days for days in thresholds if expires_at - now <= days * DAY]
    return min(within) if within else None


@dataclass(frozen=True, slots=True)
class Expiring:
    """A key or an old secret that stops working soon."""

    key_id: int
    label: str  # the key, as :func:`key_label` names it (an old secret: with its own prefix)
    what: str  # key | old_secret
    at: float  # when it stops working

    def days_left(self, now: float) -> float:
        return max(0.0, (self.at - now) / DAY)


def expiring_soon(
    keys: Iterable[ApiKey], retired: Iterable[tuple[RetiredSecret, ApiKey]], now: float, within_days: float = EXPIRING_SOON_DAYS
) -> list[Expiring]:
    """Live keys whose expiry is within ``within_days``, and old secrets still in their rotation overlap, soonest first."""
    out = [
        Expiring(int(k.id or 0), key_label(k.name, k.prefix), "key", k.expires_at)
        for k in keys
        if k.revoked_at is None and k.expires_at is not None and now < k.expires_at <= now + within_days * DAY
    ]
    out += [
        Expiring(int(key.id or 0), key_label(key.name, old.prefix), "old_secret", old.valid_until)
        for old, key in retired
        if key.revoked_at is None and old.valid_until > now
    ]
    return sorted(out, key=lambda e: (e.at, e.key_id))
