"""The filters of a usage report (team, key, model, time range), read once and resolved to ids.

``/admin/usage``, the console's usage page and its CSV export read their query
parameters through :func:`resolve_filters`, so the same parameters select the
same ledger rows everywhere. A team, key or model the appliance has never heard of
is a 400 naming the parameter, not an empty report that looks like "no usage".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, text

from appliance.errors import BadRequest
from appliance.metering.reports import DEFAULT_RANGE_SECONDS, parse_time

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
RANGES = ("24h", "today", "7d", "30d", "month", "custom")
HOUR_S = 3600
MAX_NAME = 200


@dataclass(frozen=True, slots=True)
class UsageFilters:
    """Which ledger rows a report covers: ``[since, until)`` and optional team, key and model."""

    since: float
    until: float
    team_id: int | None = None
    key_id: int | None = None
    model: str | None = None


def parse_to(value: str | None, now: float, *, param: str = "to") -> float | None:
    """Like :func:`parse_time`, but a bare date means the end of that day: ``to=2026-01-31`` includes the 31st."""
    if value is not None and _DATE.match(value.strip()):
        start = parse_time(value, now, param=param)
        return None if start is None else start + 86400
    return parse_time(value, now, param=param)


def custom_range(
    start: str | None,
    end: str | None,
    now: float,
    *,
    start_param: str = "from",
    end_param: str = "to",
    end_excludes_date: bool = False,
) -> tuple[float, float]:
    """``[since, until)`` from the ``from`` and ``to`` parameters: until now, and 30 days back, where left out.

    ``end_excludes_date`` reads a bare date as the end the way the older ``until`` does: that day's start."""
    until = parse_time(end, now, param=end_param) if end_excludes_date else parse_to(end, now, param=end_param)
    until = now + 1 if until is None else until
    since = parse_time(start, now, param=start_param)
    return (until - DEFAULT_RANGE_SECONDS if since is None else since), until


def preset_range(name: str, now: float) -> tuple[float, float]:
    """``[since, until)`` of a named range: the last 24 whole UTC hours (this one included), or whole UTC days ending
    with today."""
    if name == "24h":
        next_hour = (int(now) // HOUR_S + 1) * HOUR_S
        return float(next_hour - 24 * HOUR_S), float(next_hour)
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    tomorrow = (today + timedelta(days=1)).timestamp()
    if name == "today":
        return today.timestamp(), tomorrow
    if name == "7d":
        return (today - timedelta(days=6)).timestamp(), tomorrow
    if name == "30d":
        return (today - timedelta(days=29)).timestamp(), tomorrow
    if name == "month":
        return today.replace(day=1).timestamp(), tomorrow
    raise BadRequest(f"range must be one of {', '.join(RANGES)}.", param="range")


def resolve_filters(
    db: Engine,
    *,
    since: float,
    until: float,
    team: str | None = None,
    key: str | None = None,
    model: str | None = None,
) -> UsageFilters:
    """Resolve team name, key prefix (or id) and model to what the ledger holds; unknown ones are a 400."""
    if since >= until:
        raise BadRequest("from must be before to: the range must start before it ends.", param="from")
    team, key, model = (v.strip() or None if v is not None else None for v in (team, key, model))
    with db.connect() as conn:
        team_id = key_id = None
        if team:
            team_id = conn.execute(text("SELECT id FROM teams WHERE name = :n"), {"n": team}).scalar()
            if team_id is None:
                raise BadRequest(f"There is no team {team[:64]!r}.", param="team")
        if key:
            by_id = key.isdigit() and len(key) < 19
            key_id = conn.execute(
                text("SELECT id FROM api_keys WHERE id = :k" if by_id else "SELECT id FROM api_keys WHERE prefix = :k"),
                {"k": int(key) if by_id else key[:MAX_NAME]},
            ).scalar()
            if key_id is None:
                raise BadRequest(f"There is no API key {key[:24]!r}.", param="key")
        if model and not _known_model(conn, model[: MAX_NAME + 1]):
            raise BadRequest(f"No model {model[:64]!r} is installed or has recorded usage.", param="model")
    return UsageFilters(since=since, until=until, team_id=team_id, key_id=key_id, model=model)


def _known_model(conn: Connection, model: str) -> bool:
    family = model.partition(":")[0]
    known = conn.execute(
        text(
            "SELECT 1 FROM usage WHERE model = :m OR substr(model, 1, length(:m) + 1) = :m || ':'"
            " UNION ALL SELECT 1 FROM model_families f LEFT JOIN model_variants v ON v.family_id = f.id"
            " WHERE f.name = :m OR (f.name = :f AND f.name || ':' || v.name = :m) LIMIT 1"
        ),
        {"m": model, "f": family},
    ).first()
    return known is not None


@dataclass(frozen=True, slots=True)
class FilterChoices:
    """What a usage filter can name: teams, keys (prefix, name) and models (families and their variants)."""

    teams: list[str]
    keys: list[tuple[str, str]]
    models: list[str]


def filter_choices(db: Engine) -> FilterChoices:
    with db.connect() as conn:
        teams = [name for (name,) in conn.execute(text("SELECT name FROM teams ORDER BY name"))]
        keys = [(prefix, name) for prefix, name in conn.execute(text("SELECT prefix, name FROM api_keys ORDER BY name, prefix"))]
        models = {m for (m,) in conn.execute(text("SELECT DISTINCT model FROM usage"))}
        models |= {
            m
            for (m,) in conn.execute(
                text(
                    "SELECT f.name FROM model_families f UNION SELECT f.name || ':' || v.name FROM model_variants v JOIN "
                    "model_families f ON f.id = v.family_id"
                )
            )
        }
    models |= {m.partition(":")[0] for m in models}
    return FilterChoices(teams=teams, keys=keys, models=sorted(models))
