"""Budget alerts: raised with the ledger, delivered off the request path.

Raising: when a settle charges a daily or monthly token or cost counter, the same
transaction (the group-commit writer's) inserts a ``budget_alerts`` row if the
counter's ``spent`` reached one of its thresholds (the quota's ``alert_percent``, else
the ``budget_alert_thresholds`` setting, e.g. 50, 80 and 100%). ``(counter_id, percent)``
is unique, and a counter is one subject, budget and window, so each budget alerts at
most once per threshold and window; a settle that crosses several thresholds at once
raises each. The alert's audit row is written in that transaction too.

Delivering: :class:`AlertNotifier` runs on the scheduler. It POSTs each undelivered
alert to ``alert_webhook_url`` as JSON, signed like this::

    X-Appliance-Timestamp: 1764849600
    X-Appliance-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with alert_webhook_secret>

A failed delivery (connection error, timeout, non-2xx) is retried with exponential
backoff, up to :data:`MAX_ATTEMPTS` times; the last error stays on the alert. No
request ever waits for a webhook.

Key expiry alerts (:mod:`appliance.metering.key_expiry`) are rows of the same table
(``kind`` ``key_expiry``), so they reach the banner, the Alerts page and the webhook
the same way; their payload's ``type`` is ``key.expiry``. Every alert names a key as
:func:`appliance.accounts.labels.key_label` does: ``reporting-app (ak_N5X07USWQ…)``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
from sqlalchemy import Engine, text

from appliance.accounts.labels import subject_label as label_of
from appliance.metering.quotas import DIMENSIONS, Windows
from appliance.settings import Settings

log = logging.getLogger("appliance.metering.alerts")

BUDGET_DIMENSIONS = tuple(d.name for d in DIMENSIONS if d.budget)
MAX_ATTEMPTS = 10
FIRST_RETRY_SECONDS = 5.0
LONGEST_RETRY_SECONDS = 3600.0
DELIVERY_TIMEOUT_SECONDS = 5.0
BATCH = 50

_RAISE = (
    "INSERT INTO budget_alerts (created_at, counter_id, subject_type, subject_id, dimension, window_start, limit_value,"
    " spent, percent, attempts, next_attempt_at)"
    " SELECT ?2, c.id, c.subject_type, c.subject_id, c.dimension, c.window_start, c.limit_value, c.spent, t.value, 0, ?2"
    " FROM quota_counters c LEFT JOIN quotas q ON q.subject_type = c.subject_type AND q.subject_id = c.subject_id,"
    " json_each(CASE WHEN q.alert_percent IS NULL THEN ?3 ELSE json_array(q.alert_percent) END) t"
    " WHERE c.id = ?1 AND c.dimension IN (" + ", ".join(f"'{name}'" for name in BUDGET_DIMENSIONS) + ")"
    " AND c.limit_value > 0 AND t.value > 0 AND c.spent >= c.limit_value * t.value / 100.0"
    " ORDER BY t.value"
    " ON CONFLICT (counter_id, percent) DO NOTHING"
    " RETURNING id, subject_type, subject_id, dimension, limit_value, spent, percent"
)
_NAMES = (
    "SELECT (SELECT name FROM api_keys WHERE ?1 = 'key' AND id = ?2), (SELECT prefix FROM api_keys WHERE ?1 = 'key' AND id = ?2),"
    " (SELECT name FROM teams WHERE ?1 = 'team' AND id = ?2)"
)
_AUDIT = "INSERT INTO audit_log (created_at, actor, action, target, detail) VALUES (?, 'system', 'budget.alert', ?, ?)"


def default_shares(settings: Settings) -> list[float]:
    """The shares (%) budgets alert at when their quota sets none: ``budget_alert_thresholds``, or the one share of
    the older ``budget_alert_percent`` when that is set (0: none)."""
    if settings.budget_alert_percent is not None:
        return [settings.budget_alert_percent] if settings.budget_alert_percent > 0 else []
    return list(settings.budget_alert_thresholds)


def subject_label(conn: sqlite3.Connection, subject_type: str, subject_id: int) -> str:
    """``name (prefix…)`` for a key, ``team:<name>`` for a team (``key:#7`` once the key or team is gone)."""
    key_name, key_prefix, team_name = conn.execute(_NAMES, (subject_type, subject_id)).fetchone()
    return label_of(subject_type, subject_id, key_name=key_name, key_prefix=key_prefix, team_name=team_name)


def raise_budget_alert(conn: sqlite3.Connection, counter_id: int, now: float, shares: Sequence[float]) -> list[int]:
    """Inside the ledger's transaction: raise the counter's alerts for the thresholds it has reached and not raised
    yet in its window (the quota's own share, else ``shares``). Returns the new alerts' ids, lowest share first."""
    rows = conn.execute(_RAISE, (counter_id, now, json.dumps(list(shares)))).fetchall()
    for _alert_id, subject_type, subject_id, dimension, limit, spent, percent in rows:
        detail = f"{dimension} reached {percent:g}% of its limit: {spent:g} of {limit:g}"
        conn.execute(_AUDIT, (now, subject_label(conn, subject_type, subject_id), detail))
    return [int(row[0]) for row in rows]


@dataclass(frozen=True, slots=True)
class Alert:
    """A budget alert (``kind`` budget), or a key expiry alert (``kind`` key_expiry: ``window_start`` is the key's
    expiry, ``limit`` the threshold in days, ``spent`` the days that were left when it was raised)."""

    id: int
    created_at: float
    subject: str
    dimension: str
    window_start: float
    window_end: float
    limit: float
    spent: float
    percent: float
    attempts: int
    delivered_at: float | None
    last_error: str | None
    dismissed_at: float | None
    kind: str = "budget"

    def payload(self) -> dict[str, object]:
        if self.kind == "key_expiry":
            return {
                "type": "key.expiry",
                "id": self.id,
                "created_at": self.created_at,
                "subject": self.subject,
                "expires_at": self.window_start,
                "threshold_days": self.limit,
                "days_left": round(self.spent, 2),
            }
        return {
            "type": "budget.alert",
            "id": self.id,
            "created_at": self.created_at,
            "subject": self.subject,
            "dimension": self.dimension,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "limit": self.limit,
            "spent": self.spent,
            "percent": self.percent,
        }


def labelled(table: str, alias: str) -> tuple[str, str]:
    """SQL for rows of ``table`` (with ``subject_type`` and ``subject_id``) and what their subject is called.

    Returns the columns naming the subject (the key's name and prefix, the team's name; NULL where they do not
    apply or the key or team is gone), which :func:`label_of_row` turns into a label, and the FROM clause joining
    the keys and teams."""
    names = "k.name, k.prefix, t.name"
    joins = (
        f"{table} {alias} LEFT JOIN api_keys k ON {alias}.subject_type = 'key' AND k.id = {alias}.subject_id"
        f" LEFT JOIN teams t ON {alias}.subject_type = 'team' AND t.id = {alias}.subject_id"
    )
    return names, joins


def label_of_row(subject_type: str, subject_id: int, key_name: str | None, key_prefix: str | None, team_name: str | None) -> str:
    """The label of a row read with :func:`labelled`'s columns."""
    return label_of(subject_type, subject_id, key_name=key_name, key_prefix=key_prefix, team_name=team_name)


_NAMES_OF_ALERT, _ALERTS_LABELLED = labelled("budget_alerts", "a")
_SELECT = (
    "SELECT a.id, a.created_at, a.subject_type, a.subject_id, a.dimension, a.window_start, a.limit_value, a.spent, a.percent,"
    f" a.attempts, a.delivered_at, a.last_error, a.dismissed_at, a.kind, {_NAMES_OF_ALERT} FROM {_ALERTS_LABELLED}"
)


def _alerts(db: Engine, where: str, params: dict[str, object]) -> list[Alert]:
    windows = Windows()
    by_name = {d.name: d for d in DIMENSIONS}
    with db.connect() as conn:
        rows = conn.execute(text(f"{_SELECT} {where}"), params).all()
    out = []
    for id_, created, stype, sid, dim, start, limit, spent, percent, attempts, delivered, error, dismissed, kind, *names in rows:
        _, end = windows.bounds(by_name[dim].window, start) if dim in by_name else (start, start)
        out.append(
            Alert(
                id_,
                created,
                label_of_row(stype, sid, *names),
                dim,
                start,
                end,
                limit,
                spent,
                percent,
                attempts,
                delivered,
                error,
                dismissed,
                kind,
            )
        )
    return out


def list_alerts(db: Engine, *, include_dismissed: bool = True, limit: int = 200) -> list[Alert]:
    where = "" if include_dismissed else "WHERE a.dismissed_at IS NULL"
    return _alerts(db, f"{where} ORDER BY a.id DESC LIMIT :n", {"n": limit})


def dismiss_alert(db: Engine, alert_id: int, now: float | None = None) -> bool:
    """Hide an alert from the console's banner; returns False when there is no such open alert."""
    with db.begin() as conn:
        result = conn.execute(
            text("UPDATE budget_alerts SET dismissed_at = :t WHERE id = :i AND dismissed_at IS NULL"),
            {"t": time.time() if now is None else now, "i": alert_id},
        )
    return result.rowcount == 1


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Appliance-Signature`` value of a webhook body sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


async def _post(client: httpx.AsyncClient, settings: Settings, payload: dict[str, object], now: float) -> httpx.Response:
    """POST ``payload`` to the alert webhook, signed with its secret (raises httpx.HTTPError when it cannot)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = str(int(now))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "llm-appliance-alerts",
        "X-Appliance-Timestamp": timestamp,
        "X-Appliance-Signature": sign(settings.alert_webhook_secret or "", timestamp, body),
    }
    return await client.post(settings.alert_webhook_url or "", content=body, headers=headers)


def _unreachable(exc: httpx.HTTPError) -> str:
    return f"{type(exc).__name__}: could not reach the webhook"


async def post_signed(client: httpx.AsyncClient, settings: Settings, payload: dict[str, object], now: float) -> str | None:
    """POST ``payload`` to the alert webhook, signed with its secret; None when it took it, else why not."""
    try:
        response = await _post(client, settings, payload, now)
    except httpx.HTTPError as exc:
        return _unreachable(exc)
    if not 200 <= response.status_code < 300:
        return f"the webhook answered {response.status_code}"
    return None


@dataclass(frozen=True, slots=True)
class WebhookTest:
    """What the webhook did with a test event: the status it answered, or why it could not be reached."""

    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


async def send_test(settings: Settings, now: float, *, transport: httpx.AsyncBaseTransport | None = None) -> WebhookTest:
    """POST a ``webhook.test`` event to the alert webhook, signed and sent as alerts are (no retry)."""
    payload: dict[str, object] = {"type": "webhook.test", "created_at": now, "message": "A test event from the appliance."}
    async with webhook_client(transport) as client:
        try:
            response = await _post(client, settings, payload, now)
        except httpx.HTTPError as exc:
            return WebhookTest(None, _unreachable(exc))
    return WebhookTest(response.status_code, None)


def webhook_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The client alerts are delivered with: a short timeout, no redirects, no proxy from the environment."""
    return httpx.AsyncClient(timeout=DELIVERY_TIMEOUT_SECONDS, transport=transport, follow_redirects=False, trust_env=False)


def next_attempt_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` + 1: 5 s, 10 s, 20 s, ... at most an hour."""
    return min(LONGEST_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** max(0, attempts - 1))


class AlertNotifier:
    """Delivers undelivered alerts to the configured webhook; the scheduler calls :meth:`deliver_due`."""

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

    @property
    def enabled(self) -> bool:
        return bool(self.settings.alert_webhook_url and self.settings.alert_webhook_secret)

    async def deliver_due(self) -> int:
        """Try every alert whose delivery is due; returns how many were delivered."""
        if not self.enabled:
            return 0
        now = self._clock()
        due = _alerts(
            self.db,
            "WHERE a.delivered_at IS NULL AND a.attempts < :max AND a.next_attempt_at <= :now ORDER BY a.id LIMIT :n",
            {"max": MAX_ATTEMPTS, "now": now, "n": BATCH},
        )
        if not due:
            return 0
        delivered = 0
        async with webhook_client(self._transport) as client:
            for alert in due:
                error = await post_signed(client, self.settings, alert.payload(), self._clock())
                self._record(alert, error)
                delivered += error is None
        return delivered

    def _record(self, alert: Alert, error: str | None) -> None:
        now = self._clock()
        attempts = alert.attempts + 1
        with self.db.begin() as conn:
            if error is None:
                conn.execute(
                    text("UPDATE budget_alerts SET attempts = :a, delivered_at = :t, last_error = NULL WHERE id = :i"),
                    {"a": attempts, "t": now, "i": alert.id},
                )
            else:
                conn.execute(
                    text("UPDATE budget_alerts SET attempts = :a, next_attempt_at = :n, last_error = :e WHERE id = :i"),
                    {"a": attempts, "n": now + next_attempt_delay(attempts), "e": error, "i": alert.id},
                )
        if error is not None:
            log.warning("budget alert %d not delivered (attempt %d of %d): %s", alert.id, attempts, MAX_ATTEMPTS, error)
