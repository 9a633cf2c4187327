"""Administration of quotas, prices and teams; every change is audit-logged.

Subjects are written ``key:<id or prefix>`` or ``team:<name>``. Changes take effect
on the very next admission: the service drops the meter's cached limits and prices,
and writes each new limit into the counter of its current window, with ``spent`` taken
from the ledger (:mod:`appliance.metering.window_spend`): a limit set or lowered
mid-window counts what the window already spent, so a key already past it is refused.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import Engine, delete, select, text
from sqlalchemy.orm import Session
from sqlmodel import col

from appliance.accounts.labels import key_label
from appliance.db.engine import session
from appliance.db.tables import ApiKey, AuditLog, Price, Quota, Team
from appliance.errors import BadRequest, Conflict, NotFound
from appliance.jsontypes import JsonObject
from appliance.metering.meter import Meter
from appliance.metering.pricing import refuse_unknown_family
from appliance.metering.quotas import BY_NAME, DIMENSIONS, Windows
from appliance.metering.window_spend import spent_sql, sync_sql, window_state

TEAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PRICE_FIELDS = ("input_per_m", "output_per_m", "cached_per_m")
ALERT_FIELD = "alert_percent"  # a quota's budget alert threshold; not a dimension
_UNCHANGED = object()
MODEL_NAME = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,64})?)$")


@dataclass(frozen=True, slots=True)
class Subject:
    type: str  # key | team
    id: int
    label: str  # key:<prefix> | team:<name>: what resolves to it again
    display: str  # how it is shown: a key as ``name (prefix…)``, a team as ``team:<name>``


class QuotaService:
    """Quotas, prices and teams. ``meter`` (optional) is told about changes at once."""

    def __init__(
        self,
        db: Engine,
        meter: Meter | None = None,
        clock: Callable[[], float] = time.time,
        families: Callable[[], Collection[str]] | None = None,
    ):
        """``families`` names the model families a price may be set for (the catalog's and the installed ones);
        without it any well-formed name is taken."""
        self.db = db
        self.meter = meter
        self._clock = clock
        self._families = families

    # -- subjects ---------------------------------------------------------------------
    def resolve(self, subject: str) -> Subject:
        kind, sep, name = subject.partition(":")
        if not sep or kind not in ("key", "team") or not name:
            raise BadRequest("Subject must be 'key:<id or prefix>' or 'team:<name>'.", param="subject")
        with session(self.db) as s:
            if kind == "key":
                query = (
                    select(ApiKey).where(col(ApiKey.id) == int(name))
                    if name.isdigit()
                    else select(ApiKey).where(col(ApiKey.prefix) == name)
                )
                key = s.execute(query).scalars().first()
                if key is None:
                    raise NotFound(f"No API key {name}.")
                return Subject("key", key.id, f"key:{key.prefix}", key_label(key.name, key.prefix, key.id))
            team = s.execute(select(Team).where(col(Team.name) == name)).scalars().first()
            if team is None and name.isdigit():
                team = s.get(Team, int(name))
            if team is None:
                raise NotFound(f"No team {name}.")
            return Subject("team", team.id, f"team:{team.name}", f"team:{team.name}")

    # -- quotas -------------------------------------------------------------------------
    def get_quota(self, subject: str) -> JsonObject:
        """Limits of a key or team, and its counters in the current windows."""
        sub = self.resolve(subject)
        with session(self.db) as s:
            row = (
                s.execute(select(Quota).where(col(Quota.subject_type) == sub.type, col(Quota.subject_id) == sub.id))
                .scalars()
                .first()
            )
            limits = {d.name: (getattr(row, d.name) if row else None) for d in DIMENSIONS}
            return {
                "subject": sub.label,
                "label": sub.display,
                "limits": limits,
                "alert_percent": row.alert_percent if row else None,
                "usage": self._usage(s, sub, limits),
            }

    def _usage(self, s: Session, sub: Subject, limits: dict[str, float | None]) -> JsonObject:
        """Each counter of the current windows; a limit whose window has no counter yet shows the ledger's spend."""
        now = self._clock()
        windows = Windows()
        usage = {}
        for d in DIMENSIONS:
            start, end = windows.bounds(d.window, now)
            found = s.execute(
                text(
                    "SELECT limit_value, spent, reserved FROM quota_counters WHERE subject_type = :t AND subject_id = :i"
                    " AND dimension = :d AND window_start = :w"
                ),
                {"t": sub.type, "i": sub.id, "d": d.name, "w": start},
            ).first()
            row = None if found is None else (float(found[0]), float(found[1]), float(found[2]))
            if row is None and limits.get(d.name) is not None:
                params = {"subject_id": sub.id, "start": start, "end": end}
                spent_now = s.execute(text("SELECT " + spent_sql(sub.type, d, self._cache_counts())), params).scalar_one()
                row = (float(limits[d.name] or 0), float(spent_now), 0.0)
            if row is not None:
                limit, spent, reserved = row
                usage[d.name] = {
                    "window_start": start if d.window else None,
                    "resets_at": end if math.isfinite(end) else None,
                    "limit": limit,
                    "spent": spent,
                    "reserved": reserved,
                    "remaining": max(0.0, limit - spent - reserved),
                    "state": window_state(limit, spent, reserved, d.window is None),
                }
        return usage

    def set_quota(self, subject: str, changes: dict[str, float | int | None], actor: str) -> JsonObject:
        """Set the given dimensions (None clears one); the others keep their values."""
        sub = self.resolve(subject)
        unknown = set(changes) - set(BY_NAME) - {ALERT_FIELD}
        if unknown:
            raise BadRequest(f"Unknown quota field(s): {', '.join(sorted(unknown))}.")
        changes = dict(changes)
        alert = changes.pop(ALERT_FIELD, _UNCHANGED)
        if (
            alert is not _UNCHANGED
            and alert is not None
            and (not isinstance(alert, (int, float)) or isinstance(alert, bool) or not 0 <= alert <= 100)
        ):
            raise BadRequest(f"{ALERT_FIELD} must be a percentage from 0 to 100, or null for the default.", param=ALERT_FIELD)
        for name, value in changes.items():
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or not math.isfinite(value)
            ):
                raise BadRequest(f"{name} must be a non-negative number or null.", param=name)
            if value is not None and BY_NAME[name].unit != "cost" and not float(value).is_integer():
                raise BadRequest(f"{name} must be a whole number.", param=name)
        now = self._clock()
        windows = Windows()
        spent = self._window_spend(sub, [name for name, value in changes.items() if value is not None], now)
        with session(self.db) as s:
            row = (
                s.execute(select(Quota).where(col(Quota.subject_type) == sub.type, col(Quota.subject_id) == sub.id))
                .scalars()
                .first()
            )
            if row is None:
                row = Quota(subject_type=sub.type, subject_id=sub.id)
            before = {d.name: getattr(row, d.name) for d in DIMENSIONS}
            for name, value in changes.items():
                setattr(row, name, None if value is None else (float(value) if BY_NAME[name].unit == "cost" else int(value)))
            before[ALERT_FIELD] = row.alert_percent
            if alert is None or isinstance(alert, (int, float)):  # checked above: a percentage, or None for the default
                row.alert_percent = None if alert is None else float(alert)
            s.add(row)
            for name, value in changes.items():
                if name in spent:  # the running window: the new limit, and the ledger's spend
                    params = {"subject_type": sub.type, "subject_id": sub.id, "dimension": name, "limit": float(value or 0)}
                    s.execute(text(sync_sql(sub.type, BY_NAME[name], self._cache_counts())), {**params, **spent[name]})
                if value is not None:  # running windows take the new limit at once
                    start, _ = windows.bounds(BY_NAME[name].window, now)
                    s.execute(
                        text(
                            "UPDATE quota_counters SET limit_value = :v WHERE subject_type = :t AND subject_id = :i"
                            " AND dimension = :d AND window_start >= :w"
                        ),
                        {"v": float(value), "t": sub.type, "i": sub.id, "d": name, "w": start},
                    )
            after = {d.name: getattr(row, d.name) for d in DIMENSIONS} | {ALERT_FIELD: row.alert_percent}
            self._audit(s, actor, "quota.set", sub.label, {"before": before, "after": after})
            s.commit()
        self._changed_quotas()
        return self.get_quota(sub.label)

    def delete_quota(self, subject: str, actor: str) -> None:
        sub = self.resolve(subject)
        with session(self.db) as s:
            s.execute(delete(Quota).where(col(Quota.subject_type) == sub.type, col(Quota.subject_id) == sub.id))
            self._audit(s, actor, "quota.delete", sub.label, None)
            s.commit()
        self._changed_quotas()

    def _window_spend(self, sub: Subject, names: list[str], now: float) -> dict[str, dict[str, float]]:
        """For each windowed dimension in ``names``: its window, the largest ledger id now committed (``upto``)
        and what the ledger holds for the window up to it (``base``): read before set_quota's write transaction."""
        windows = Windows()
        out: dict[str, dict[str, float]] = {}
        with session(self.db) as s:
            upto = s.execute(text("SELECT coalesce(max(id), 0) FROM usage")).scalar_one()
            for name in names:
                dimension = BY_NAME[name]
                if dimension.window is None:
                    continue
                start, end = windows.bounds(dimension.window, now)
                window = {"subject_id": sub.id, "start": start, "end": end, "upto": upto}
                base = s.execute(text("SELECT " + spent_sql(sub.type, dimension, self._cache_counts(), "upto")), window)
                out[name] = {"start": start, "end": end, "upto": upto, "base": float(base.scalar_one())}
        return out

    def _cache_counts(self) -> bool:
        """Whether cached tokens count against token quotas (the meter's setting; they do without a meter)."""
        return self.meter is None or self.meter.settings.cache_counts_against_quota

    def _changed_quotas(self) -> None:
        if self.meter is not None:
            self.meter.invalidate_quotas()

    # -- prices -------------------------------------------------------------------------
    @staticmethod
    def _check_model(model: str) -> str:
        if not MODEL_NAME.match(model):
            raise BadRequest("Model must be '*', 'family' or 'family:variant'.", param="model")
        return model

    def list_prices(self) -> list[JsonObject]:
        with session(self.db) as s:
            return [p.model_dump() for p in s.execute(select(Price).order_by(Price.model)).scalars()]

    def get_price(self, model: str) -> JsonObject:
        with session(self.db) as s:
            row = s.get(Price, self._check_model(model))
            if row is None:
                raise NotFound(f"No price for {model}.")
            return row.model_dump()

    def set_price(self, model: str, changes: dict[str, float | None], actor: str) -> JsonObject:
        """Set the given rates (per million tokens); a new row starts at zero. A family the appliance does not know
        is refused (a typo would price nothing); its variant may be one still to be installed."""
        self._check_model(model)
        if self._families is not None and model != "*":
            refuse_unknown_family(model.partition(":")[0], self._families())
        rates: dict[str, float] = {}
        for name, value in changes.items():
            if name not in PRICE_FIELDS:
                raise BadRequest(f"Unknown price field {name}.", param=name)
            if (
                value is None
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value < 0
                or not math.isfinite(value)
            ):
                raise BadRequest(f"{name} must be a non-negative number.", param=name)
            rates[name] = float(value)
        with session(self.db) as s:
            row = s.get(Price, model) or Price(model=model)
            before = row.model_dump()
            for name, rate in rates.items():
                setattr(row, name, rate)
            s.add(row)
            after = row.model_dump()
            self._audit(s, actor, "price.set", model, {"before": before, "after": after})
            s.commit()
        self._changed_prices()
        return after

    def delete_price(self, model: str, actor: str) -> None:
        with session(self.db) as s:
            row = s.get(Price, self._check_model(model))
            if row is None:
                raise NotFound(f"No price for {model}.")
            s.delete(row)
            self._audit(s, actor, "price.delete", model, None)
            s.commit()
        self._changed_prices()

    def _changed_prices(self) -> None:
        if self.meter is not None:
            self.meter.prices.invalidate()

    # -- teams ----------------------------------------------------------------------------
    def create_team(self, name: str, actor: str) -> JsonObject:
        if not TEAM_NAME.match(name or ""):
            raise BadRequest("Team names are 1 to 64 letters, digits, '.', '_' or '-'.", param="name")
        with session(self.db) as s:
            existing = s.execute(select(Team).where(col(Team.name) == name)).scalars().first()
            if existing is not None and existing.deleted_at is not None:
                raise Conflict(
                    f"Team {name} was deleted; its name stays reserved so past usage keeps one meaning. Choose another name."
                )
            if existing is not None:
                raise Conflict(f"Team {name} already exists.")
            team = Team(name=name)
            s.add(team)
            s.flush()
            self._audit(s, actor, "team.create", f"team:{name}", None)
            s.commit()
            return {"id": team.id, "name": team.name, "created_at": team.created_at, "keys": 0}

    def rename_team(self, name: str, new_name: str, actor: str) -> JsonObject:
        """Rename a live team. Keys, limits, counters, cache policy and usage rows hold the team's id, so they all follow
        the new name; the ledger keeps attributing the team's past and future use to the same team."""
        if not TEAM_NAME.match(new_name or ""):
            raise BadRequest("Team names are 1 to 64 letters, digits, '.', '_' or '-'.", param="name")
        with session(self.db) as s:
            team = s.execute(select(Team).where(col(Team.name) == name, col(Team.deleted_at).is_(None))).scalars().first()
            if team is None:
                raise NotFound(f"No team {name}.")
            if new_name != name:
                taken = s.execute(select(Team).where(col(Team.name) == new_name)).scalars().first()
                if taken is not None:
                    reserved = " (a deleted team's name stays reserved)" if taken.deleted_at is not None else ""
                    raise Conflict(f"Team {new_name} already exists{reserved}.", code="team_exists")
                team.name = new_name
                s.add(team)
                self._audit(s, actor, "team.rename", f"team:{new_name}", {"from": name, "to": new_name})
                s.commit()
            result: JsonObject = {"id": team.id, "name": new_name, "created_at": team.created_at}
        self._changed_quotas()
        return result

    def list_teams(self) -> list[JsonObject]:
        with session(self.db) as s:
            rows = s.execute(
                text(
                    "SELECT t.id, t.name, t.created_at, count(k.id) FROM teams t"
                    " LEFT JOIN api_keys k ON k.team_id = t.id AND k.revoked_at IS NULL WHERE t.deleted_at IS NULL"
                    " GROUP BY t.id ORDER BY t.name"
                )
            ).all()
        return [{"id": i, "name": n, "created_at": c, "keys": k} for i, n, c, k in rows]

    def delete_team(self, name: str, actor: str) -> JsonObject:
        """Delete a team that has no live keys: it leaves the lists and its limits go, while its row stays
        (marked deleted, name reserved) so usage rows and revoked keys still name it. A team with live keys
        is refused (``Conflict``): revoke them or move them to another team first, so no client loses
        access as a side effect."""
        with session(self.db) as s:
            team = s.execute(select(Team).where(col(Team.name) == name, col(Team.deleted_at).is_(None))).scalars().first()
            if team is None:
                raise NotFound(f"No team {name}.")
            live = s.execute(
                text("SELECT count(*) FROM api_keys WHERE team_id = :t AND revoked_at IS NULL"), {"t": team.id}
            ).scalar_one()
            if live:
                raise Conflict(
                    f"Team {name} still has {live} active key{'s' if live != 1 else ''}; revoke them or move them "
                    "to another team first.",
                    code="team_has_keys",
                )
            team.deleted_at = self._clock()
            s.add(team)
            s.execute(delete(Quota).where(col(Quota.subject_type) == "team", col(Quota.subject_id) == team.id))
            self._audit(s, actor, "team.delete", f"team:{name}", None)
            s.commit()
            result: JsonObject = {"id": team.id, "name": team.name, "deleted_at": team.deleted_at}
        self._changed_quotas()
        return result

    # -- audit -------------------------------------------------------------------------
    def _audit(self, s: Session, actor: str, action: str, target: str, detail: JsonObject | None) -> None:
        s.add(
            AuditLog(
                actor=actor,
                action=action,
                target=target,
                detail=json.dumps(detail, sort_keys=True) if detail is not None else None,
            )
        )
