"""Key expiry alerts: raised when a live key comes within 14 days, then within 1 day, of its expiry.

Each is a ``budget_alerts`` row of kind ``key_expiry`` (so the console's banner, the Alerts page and the signed webhook
carry it as they carry budget alerts), at most one per key, expiry and threshold: a ``dedupe_key`` such as
``key-expiry:7:1767225600:14d``. Changing a key's expiry makes it a new expiry, which alerts again when it comes near.
A key already past its expiry raises nothing (it is refused, and the Keys page says so). Each alert writes an
``audit_log`` row (actor ``system``, action ``key.expiry_alert``). :meth:`KeyExpiryAlerts.raise_due` runs on the
scheduler and right after an expiry is set or changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine, text

from appliance.accounts.labels import key_label
from appliance.accounts.lifecycle import DAY, EXPIRY_ALERT_DAYS, alert_threshold

log = logging.getLogger("appliance.metering.key_expiry")

CHECK_EVERY_SECONDS = 600
_CANDIDATES = (
    "SELECT id, name, prefix, expires_at FROM api_keys"
    " WHERE revoked_at IS NULL AND expires_at IS NOT NULL AND expires_at > :now AND expires_at <= :horizon"
)
_RAISE = (
    "INSERT INTO budget_alerts (created_at, kind, dedupe_key, subject_type, subject_id, dimension, window_start,"
    " limit_value, spent, percent, attempts, next_attempt_at)"
    " VALUES (:now, 'key_expiry', :dedupe, 'key', :key_id, 'expiry', :expires_at, :days, :left, 0, 0, :now)"
    " ON CONFLICT (dedupe_key) DO NOTHING RETURNING id"
)
_AUDIT = (
    "INSERT INTO audit_log (created_at, actor, action, target, detail)"
    " VALUES (:now, 'system', 'key.expiry_alert', :target, :detail)"
)


def dedupe_key(key_id: int, expires_at: float, threshold_days: int) -> str:
    return f"key-expiry:{key_id}:{int(expires_at)}:{threshold_days}d"


class KeyExpiryAlerts:
    """Raises the expiry alerts that are due; the webhook delivery is :class:`appliance.metering.alerts.AlertNotifier`'s."""

    def __init__(self, db: Engine, *, clock: Callable[[], float] = time.time):
        self.db = db
        self._clock = clock

    def raise_due(self) -> list[int]:
        """Raise every key's alert that is due and not yet raised; returns the new alerts' ids."""
        now = self._clock()
        raised = []
        with self.db.begin() as conn:
            keys = conn.execute(text(_CANDIDATES), {"now": now, "horizon": now + max(EXPIRY_ALERT_DAYS) * DAY}).all()
            for key_id, name, prefix, expires_at in keys:
                days = alert_threshold(expires_at, now)
                if days is None:
                    continue
                left = (expires_at - now) / DAY
                params = {
                    "now": now,
                    "dedupe": dedupe_key(key_id, expires_at, days),
                    "key_id": key_id,
                    "expires_at": expires_at,
                    "days": float(days),
                    "left": left,
                }
                alert_id = conn.execute(text(_RAISE), params).scalar()
                if alert_id is None:
                    continue
                label = key_label(name, prefix, key_id)
                detail = f"expires within {days} day{'s' if days != 1 else ''} ({left:.1f} days left)"
                conn.execute(text(_AUDIT), {"now": now, "target": label, "detail": detail})
                log.warning("API key %s %s", label, detail)
                raised.append(int(alert_id))
        return raised

    async def check(self) -> list[int]:
        """:meth:`raise_due` off the event loop (the scheduler's job)."""
        return await asyncio.to_thread(self.raise_due)
