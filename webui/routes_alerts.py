"""Budget alerts: the banner every page loads, the Alerts page, dismissing an alert, and a test of the webhook."""

from __future__ import annotations

import time

from litestar import Request, Response, get, post
from sqlalchemy import text
from sqlalchemy.engine import Engine

from appliance.db.audit import AuditTrail
from appliance.errors import BadRequest, NotFound
from appliance.metering.alerts import MAX_ATTEMPTS, default_shares, dismiss_alert, list_alerts, send_test
from appliance.settings import Settings
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import TemplateContext, page, partial


@get("/alerts/banner", include_in_schema=False, sync_to_thread=True)
def alerts_banner(request: Request, db: Engine) -> Response:
    """The open alerts, as a banner at the top of every page (empty when there are none)."""
    return partial(request, "_alerts_banner.html", alerts=list_alerts(db, include_dismissed=False, limit=5))


def _alert_keys(db: Engine) -> dict[int, str]:
    """The prefix of the key each recent alert is about, for the link to that key's requests."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.id, k.prefix FROM budget_alerts a JOIN api_keys k ON k.id = a.subject_id"
                " WHERE a.subject_type = 'key' ORDER BY a.id DESC LIMIT 200"
            )
        )
        return {int(alert_id): prefix for alert_id, prefix in rows}


def _alerts_context(db: Engine, settings: Settings, message: str | None = None) -> TemplateContext:
    return {
        "alerts": list_alerts(db),
        "alert_keys": _alert_keys(db),
        "webhook": settings.alert_webhook_url,
        "default_shares": default_shares(settings),
        "max_attempts": MAX_ATTEMPTS,
        "message": message,
    }


@get("/alerts", include_in_schema=False, sync_to_thread=True)
def alerts_page(request: Request, db: Engine, settings: Settings) -> Response:
    return page(request, "alerts.html", active="alerts", **_alerts_context(db, settings))


@post("/alerts/{alert_id:int}/dismiss", guards=[needs("operator")], include_in_schema=False, sync_to_thread=True)
def dismiss(request: Request, alert_id: int, db: Engine, settings: Settings, audit: AuditTrail, user: ConsoleUser) -> Response:
    if not dismiss_alert(db, alert_id):
        raise NotFound(f"No open alert {alert_id}.")
    audit.record(user.actor, "budget.alert_dismissed", f"alert:{alert_id}")
    return partial(request, "_alerts.html", **_alerts_context(db, settings, message=f"Alert {alert_id} dismissed."))


@post("/alerts/test", guards=[needs("admin")], include_in_schema=False)
async def test_webhook(request: Request, settings: Settings, audit: AuditTrail, user: ConsoleUser) -> Response:
    """Send a signed test event to the alert webhook now and show what it answered; audited either way."""
    if not (settings.alert_webhook_url and settings.alert_webhook_secret):
        raise BadRequest("No alert webhook is configured (alert_webhook_url and alert_webhook_secret).")
    result = await send_test(settings, time.time())
    outcome = f"status={result.status}" if result.error is None else result.error
    audit.record(user.actor, "alert.webhook_test", "alert_webhook_url", outcome)
    return partial(request, "_alert_test.html", result=result)


HANDLERS = [alerts_banner, alerts_page, dismiss, test_webhook]
