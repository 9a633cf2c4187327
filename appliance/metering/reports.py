"""Usage reports from the ledger: filters, grouping, CSV.

SQL is assembled only from the fixed fragments below; every value a user gives
is a bound parameter.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, Row, text

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.metering.pricing import PriceBook, cost_of
from appliance.metering.series import percentile

DEFAULT_RANGE_SECONDS = 30 * 86400
_RELATIVE = re.compile(r"^(\d{1,6})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# by -> (select columns, group expression)
GROUPS = {
    "key": ("u.key_id AS key_id, k.prefix AS key, k.name AS key_name", "u.key_id"),
    "team": ("u.team_id AS team_id, t.name AS team", "u.team_id"),
    "model": ("u.model AS model", "u.model"),
    "day": ("date(u.created_at, 'unixepoch') AS day", "date(u.created_at, 'unixepoch')"),
    "hour": (
        "strftime('%Y-%m-%dT%H:00:00Z', u.created_at, 'unixepoch') AS hour",
        "strftime('%Y-%m-%dT%H', u.created_at, 'unixepoch')",
    ),
}
_GROUP_COLUMNS = {
    "key": ("key_id", "key", "key_name"),
    "team": ("team_id", "team"),
    "model": ("model",),
    "day": ("day",),
    "hour": ("hour",),
}
SUMS = (
    "requests",
    "failed",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "total_tokens",
    "cost",
    "energy_joules",
    "cache_hits",
    "cache_tokens",
)
PERCENTILES = ("ttft_p50_ms", "ttft_p95_ms", "latency_p50_ms", "latency_p95_ms")
MEASURES = (*SUMS, "cache_saved", *PERCENTILES)
_AGGREGATES = (
    "count(*) AS requests, coalesce(sum(u.status >= 400), 0) AS failed, coalesce(sum(u.prompt_tokens), 0) AS prompt_tokens,"
    " coalesce(sum(u.completion_tokens), 0) AS completion_tokens, coalesce(sum(u.cached_tokens), 0) AS cached_tokens,"
    " coalesce(sum(u.prompt_tokens + u.completion_tokens), 0) AS total_tokens, coalesce(sum(u.cost), 0) AS cost,"
    " sum(u.energy_joules) AS energy_joules, coalesce(sum(u.cache_tier != 'miss'), 0) AS cache_hits,"
    " coalesce(sum(CASE WHEN u.cache_tier != 'miss' THEN u.prompt_tokens + u.completion_tokens ELSE 0 END), 0) AS cache_tokens"
)


def parse_time(value: str | None, now: float, *, param: str) -> float | None:
    """Epoch seconds, ISO 8601 (UTC unless it says otherwise), or an age such as ``7d``, ``12h``."""
    if value is None or value == "":
        return None
    value = value.strip()
    match = _RELATIVE.match(value)
    if match:
        return now - int(match.group(1)) * _UNITS[match.group(2)]
    try:
        return float(value) if re.fullmatch(r"\d{1,12}(\.\d+)?", value) else _iso(value)
    except ValueError:
        raise BadRequest(f"{param} must be epoch seconds, an ISO 8601 date or time, or an age like 7d.", param=param) from None


def _iso(value: str) -> float:
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_by(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    parts = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
    unknown = [p for p in parts if p not in GROUPS]
    if unknown:
        raise BadRequest(f"by must be a comma-separated list of {', '.join(GROUPS)}.", param="by")
    return parts


def query_usage(
    db: Engine,
    *,
    since: float | None = None,
    until: float | None = None,
    key_id: int | None = None,
    team_id: int | None = None,
    model: str | None = None,
    by: tuple[str, ...] = (),
    now: float | None = None,
) -> JsonObject:
    """Usage between ``since`` (inclusive) and ``until`` (exclusive), grouped by ``by``.

    Besides the sums, each row (and the totals) carries the cache savings (``cache_hits``,
    ``cache_tokens`` and ``cache_saved``: what the answers served from the response cache
    would have cost at their model's current price, less what they were charged) and the
    nearest-rank p50/p95 of TTFT (answers an engine generated) and latency (successful requests).
    The console, ``/admin/usage`` and both CSV exports all read their figures from here.
    """
    now = time.time() if now is None else now
    until = now + 1 if until is None else until
    since = until - DEFAULT_RANGE_SECONDS if since is None else since
    where = ["u.created_at >= :since", "u.created_at < :until"]
    params: dict[str, float | int | str] = {"since": since, "until": until}
    if key_id is not None:
        where.append("u.key_id = :key_id")
        params["key_id"] = key_id
    if team_id is not None:
        where.append("u.team_id = :team_id")
        params["team_id"] = team_id
    if model:
        # a family name matches all its variants
        where.append("(u.model = :model OR substr(u.model, 1, length(:model) + 1) = :model || ':')")
        params["model"] = model
    source = (
        f" FROM usage u LEFT JOIN api_keys k ON k.id = u.key_id LEFT JOIN teams t ON t.id = u.team_id WHERE {' AND '.join(where)}"
    )
    groups = [GROUPS[b][1] for b in by]
    marks = [f"{g} AS _g{i}" for i, g in enumerate(groups)]
    select = ", ".join([GROUPS[b][0] for b in by] + marks + [_AGGREGATES])
    sql = f"SELECT {select}{source}"
    if by:
        sql += f" GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}"
    timing_sql = f"SELECT {', '.join([*marks, 'u.ttft_ms', 'u.latency_ms', 'u.cache_tier'])}{source} AND u.status < 400"
    hits_sql = (
        f"SELECT {', '.join([*marks, 'u.model', 'u.variant'])}, sum(u.prompt_tokens), sum(u.completion_tokens), sum(u.cost)"
        f"{source} AND u.cache_tier != 'miss' GROUP BY {', '.join([*groups, 'u.model', 'u.variant'])}"
    )
    with db.connect() as conn:
        found = [dict(r._mapping) for r in conn.execute(text(sql), params)]
        timings = conn.execute(text(timing_sql), params).all()
        hits = conn.execute(text(hits_sql), params).all()
        prices = PriceBook(lambda: conn.execute(text("SELECT model, input_per_m, output_per_m, cached_per_m FROM prices")).all())
        saved = _cache_saved(hits, len(groups), prices)
    if not by and found and found[0]["requests"] == 0:
        found = []
    ttfts, latencies = _timings(timings, len(groups))
    rows = []
    for row in found:
        group = tuple(row.pop(f"_g{i}") for i in range(len(groups)))
        rows.append({**row, "cache_saved": saved.get(group, 0.0), **_percentiles(ttfts.get(group, []), latencies.get(group, []))})
    totals: JsonObject = {m: sum((r[m] or 0) for r in rows) for m in (*SUMS, "cache_saved")}
    if all(r["energy_joules"] is None for r in rows):
        totals["energy_joules"] = None
    totals.update(_percentiles([v for vs in ttfts.values() for v in vs], [v for vs in latencies.values() for v in vs]))
    return {"since": since, "until": until, "by": list(by), "rows": rows, "totals": totals}


def _timings(timings: Sequence[Row], width: int) -> tuple[dict[tuple, list[float]], dict[tuple, list[float]]]:
    """TTFTs of engine answers and latencies of successful requests, by group."""
    ttfts: dict[tuple, list[float]] = {}
    latencies: dict[tuple, list[float]] = {}
    for row in timings:
        group, (ttft, latency, tier) = tuple(row[:width]), row[width:]
        if ttft is not None and tier == "miss":
            ttfts.setdefault(group, []).append(float(ttft))
        if latency is not None:
            latencies.setdefault(group, []).append(float(latency))
    return ttfts, latencies


def _percentiles(ttfts: list[float], latencies: list[float]) -> JsonObject:
    ttfts, latencies = sorted(ttfts), sorted(latencies)
    return {
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p95_ms": percentile(ttfts, 95),
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p95_ms": percentile(latencies, 95),
    }


def _cache_saved(hits: Sequence[Row], width: int, prices: PriceBook) -> dict[tuple, float]:
    """By group: list cost of the cache answers at their model's current price, less what they were charged."""
    saved: dict[tuple, float] = {}
    for row in hits:
        group, (model, variant, prompt, completion, charged) = tuple(row[:width]), row[width:]
        full = cost_of(
            prices.rate(model, variant),
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
            cached_tokens=0,
            cache_hit=False,
        )
        saved[group] = saved.get(group, 0.0) + full - float(charged or 0)
    return saved


COST_DECIMALS = 6  # a millionth of the currency: a request's cost at small-model prices still shows
OWNER_COLUMNS = ("owner_cost", "owner_cost_per_million")  # with box costs set (appliance.metering.economics)
_CSV_DECIMALS = (
    {"cost": COST_DECIMALS, "cache_saved": COST_DECIMALS, "energy_joules": 1}
    | {p: 1 for p in PERCENTILES}
    | dict.fromkeys(OWNER_COLUMNS, COST_DECIMALS)
)
_CSV_INTEGERS = frozenset(SUMS) - _CSV_DECIMALS.keys()


def to_csv(report: JsonObject) -> str:
    """The report's rows as CSV: counts as integers, costs to a millionth, milliseconds and joules to a tenth (never 1e-05)."""
    columns = [c for b in report["by"] for c in _GROUP_COLUMNS[b]] + list(MEASURES)
    columns += [c for c in OWNER_COLUMNS if c in report["totals"]]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in report["rows"]:
        writer.writerow({c: _csv_number(c, row.get(c)) for c in columns})
    return out.getvalue()


def _csv_number(column: str, value: object) -> object:
    """A number as the CSV writes it (a computed figure, so no formula guard); any other cell through ``csv_cell``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return csv_cell(value)
    if column in _CSV_INTEGERS:
        return int(round(value))
    decimals = _CSV_DECIMALS.get(column)
    if decimals is None:
        return value
    text = f"{value:.{decimals}f}"
    return f"{0:.{decimals}f}" if float(text) == 0 else text  # never "-0.000000"


def csv_cell(value: object) -> object:
    # A cell starting with = + - @ would be a formula to a spreadsheet (CSV injection).
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value
