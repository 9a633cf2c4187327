"""The alert raised when the served certificate has less than :data:`ALERT_DAYS` days left.

Raised like a budget alert: once per certificate (a ``kv`` row keyed by its fingerprint), with an
``audit_log`` row (actor ``system``, action ``tls.expiry``) and, when ``alert_webhook_url`` is set,
a JSON POST signed exactly as budget alerts are (``X-Appliance-Signature``), tried again at each
check until it is delivered. The daemon checks at start, after each reload and every few hours.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import httpx
from sqlalchemy import Engine

from appliance.db.engine import session
from appliance.db.tables import AuditLog, Setting
from appliance.metering.alerts import post_signed, webhook_client
from appliance.settings import Settings
from appliance.tls.certinfo import CertInfo

log = logging.getLogger("appliance.tls.expiry")

ALERT_DAYS = 30
CHECK_EVERY_SECONDS = 6 * 3600.0


def _kv_key(cert: CertInfo) -> str:
    return "tls-expiry:" + cert.fingerprint.replace(":", "")[:40]


class ExpiryWatch:
    """Raises and delivers the expiry alert of the served certificate; :meth:`check` is called by the daemon."""

    def __init__(
        self,
        settings: Settings,
        db: Engine,
        *,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.settings = settings
        self.db = db
        self._clock = clock
        self._transport = transport

    def payload(self, cert: CertInfo) -> dict[str, object]:
        return {
            "type": "tls.expiry",
            "fingerprint_sha256": cert.fingerprint,
            "subject": cert.subject,
            "not_after": cert.not_after.isoformat(),
            "days_left": round(cert.days_left(), 1),
        }

    async def check(self, cert: CertInfo | None) -> bool:
        """True when the certificate is within the alert window (the alert is raised, once, and delivered if it can be)."""
        if cert is None or cert.days_left() > ALERT_DAYS:
            return False
        key = _kv_key(cert)
        with session(self.db) as s:
            row = s.get(Setting, key)
            if row is None:
                detail = (
                    f"certificate {cert.fingerprint} expires {cert.not_after:%Y-%m-%d %H:%M} UTC ({cert.days_left():.0f} days)"
                )
                s.add(AuditLog(actor="system", action="tls.expiry", target=cert.subject[:200], detail=detail))
                row = Setting(key=key, value=json.dumps({"raised": self._clock(), "delivered": None}))
                s.add(row)
                s.commit()
                log.warning("TLS certificate expires soon: %s", detail)
            state = json.loads(row.value)
        webhook = bool(self.settings.alert_webhook_url and self.settings.alert_webhook_secret)
        if state.get("delivered") is None and webhook and await self._post(cert):
            state["delivered"] = self._clock()
            with session(self.db) as s:
                stored = s.get(Setting, key)
                if stored is not None:
                    stored.value = json.dumps(state)
                    s.commit()
        return True

    async def _post(self, cert: CertInfo) -> bool:
        async with webhook_client(self._transport) as client:
            error = await post_signed(client, self.settings, self.payload(cert), self._clock())
        if error is not None:
            log.warning("TLS expiry alert not delivered: %s", error)
        return error is None
