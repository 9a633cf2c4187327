"""The audit trail: who did what to which thing, one row per admin action."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from appliance.db.engine import session
from appliance.db.tables import AuditLog


class AuditTrail:
    """Writes ``audit_log`` rows; actors are ``key:<prefix>``, ``user:<name>``, ``local-admin`` or ``system``."""

    def __init__(self, db: Engine):
        self._db = db

    def record(self, actor: str, action: str, target: str | None = None, detail: str | None = None) -> None:
        with session(self._db) as s:
            s.add(AuditLog(actor=actor, action=action, target=target, detail=detail))
            s.commit()
