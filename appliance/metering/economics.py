"""What a token costs the owner, how busy the engines are, and how many more tokens/s the box could make.

Pure functions over ledger rows (:class:`appliance.metering.attainment.LedgerRow`):

* **Tokens produced**: completion tokens in the ledger (answers from the response cache included: the owner
  delivered them too) of the requests that started in the window.
* **Busy time** of an engine (a model): the length of the union of its requests' intervals
  ``[created_at, created_at + latency]`` clipped to the window, engine answers only. It is the time at least one
  request was admitted and not yet settled on that model -- queueing for a slot included, requests still running
  at the time of reading not yet (they are in the ledger once settled). Utilisation = busy time / window.
* **Owner cost** of a window: hours x ``box_cost_per_hour`` + kWh x ``energy_price_per_kwh``, where kWh is the
  energy the requests recorded (RAPL/NVML) when any did, else ``box_power_watts`` for the whole window. A model's
  share of it is its share of the engines' busy time (its tokens' share when nothing was busy); its cost per million
  tokens is that share over its tokens produced.
* **Headroom** of a loaded model: the planner's aggregate decode tokens/s for it x (1 - utilisation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from appliance.metering.attainment import LedgerRow
from appliance.settings import Settings

JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, slots=True)
class OwnerRates:
    box_cost_per_hour: float = 0.0
    energy_price_per_kwh: float = 0.0
    box_power_watts: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> OwnerRates:
        return cls(settings.box_cost_per_hour, settings.energy_price_per_kwh, settings.box_power_watts)

    @property
    def known(self) -> bool:
        """Whether any cost is configured (else costs are unknown, not zero)."""
        return self.box_cost_per_hour > 0 or self.energy_price_per_kwh > 0


def busy_seconds(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` (start, end) within [start, end)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end and b > a)
    total = 0.0
    run_start, run_end = None, None
    for a, b in clipped:
        if run_end is None or a > run_end:
            if run_end is not None and run_start is not None:
                total += run_end - run_start
            run_start, run_end = a, b
        else:
            run_end = max(run_end, b)
    if run_end is not None and run_start is not None:
        total += run_end - run_start
    return total


def window_cost(rates: OwnerRates, seconds: float, measured_joules: float | None) -> float:
    """The owner's cost of ``seconds`` of the box: amortised hardware plus energy (measured, else the configured draw)."""
    hours = seconds / 3600.0
    kwh = measured_joules / JOULES_PER_KWH if measured_joules is not None else rates.box_power_watts * hours / 1000.0
    return hours * rates.box_cost_per_hour + kwh * rates.energy_price_per_kwh


def per_million(cost: float, tokens: int) -> float | None:
    return cost / tokens * 1e6 if tokens > 0 else None


@dataclass(frozen=True, slots=True)
class ModelEconomics:
    tokens: int
    busy_s: float
    utilisation: float
    cost: float | None
    cost_per_million: float | None
    headroom_tps: float | None


@dataclass(frozen=True, slots=True)
class Economics:
    seconds: float
    tokens: int
    energy_joules: float | None
    cost: float | None
    cost_per_million: float | None
    models: dict[str, ModelEconomics] = field(default_factory=dict)

    @property
    def tokens_per_hour(self) -> float:
        return self.tokens / (self.seconds / 3600.0) if self.seconds > 0 else 0.0


def economics(
    rows: Iterable[LedgerRow], since: float, until: float, rates: OwnerRates, capacity: Mapping[str, float]
) -> Economics:
    """The window [since, until)'s figures; ``capacity`` is each loaded model's aggregate decode tokens/s."""
    seconds = max(0.0, until - since)
    tokens: dict[str, int] = {}
    intervals: dict[str, list[tuple[float, float]]] = {}
    joules: float | None = None
    for row in rows:
        if row.engine and row.latency_ms is not None:
            intervals.setdefault(row.model, []).append((row.created_at, row.created_at + row.latency_ms / 1000.0))
        if not since <= row.created_at < until:
            continue
        tokens[row.model] = tokens.get(row.model, 0) + row.completion_tokens
        if row.energy_joules is not None:
            joules = (joules or 0.0) + row.energy_joules
    busy = {m: busy_seconds(spans, since, until) for m, spans in intervals.items()}
    total_tokens = sum(tokens.values())
    cost = window_cost(rates, seconds, joules) if rates.known else None
    total_busy = sum(busy.values())
    models: dict[str, ModelEconomics] = {}
    for model in sorted(set(tokens) | set(busy) | set(capacity)):
        mine_busy, mine_tokens = busy.get(model, 0.0), tokens.get(model, 0)
        share = mine_busy / total_busy if total_busy > 0 else (mine_tokens / total_tokens if total_tokens else 0.0)
        utilisation = min(1.0, mine_busy / seconds) if seconds > 0 else 0.0
        mine_cost = cost * share if cost is not None else None
        speed = capacity.get(model)
        models[model] = ModelEconomics(
            tokens=mine_tokens,
            busy_s=mine_busy,
            utilisation=utilisation,
            cost=mine_cost,
            cost_per_million=per_million(mine_cost, mine_tokens) if mine_cost is not None else None,
            headroom_tps=speed * (1.0 - utilisation) if speed is not None else None,
        )
    return Economics(
        seconds=seconds,
        tokens=total_tokens,
        energy_joules=joules,
        cost=cost,
        cost_per_million=per_million(cost, total_tokens) if cost is not None else None,
        models=models,
    )


_BOX_TOTALS = text(
    "SELECT coalesce(sum(completion_tokens), 0), sum(energy_joules) FROM usage WHERE created_at >= :since AND created_at < :until"
)


def box_totals(db: Engine, since: float, until: float) -> tuple[int, float | None]:
    """Completion tokens and measured joules of the whole box in [since, until), whatever a report filters."""
    with db.connect() as conn:
        tokens, joules = conn.execute(_BOX_TOTALS, {"since": since, "until": until}).one()
    return int(tokens), (float(joules) if joules is not None else None)


def report_owner_cost(report: dict, rates: OwnerRates, box: tuple[int, float | None], now: float) -> dict:
    """A usage report (:func:`appliance.metering.reports.query_usage`) with ``owner_cost_per_million`` (the box's
    owner cost over the report's range, up to now, over all tokens produced in it, from :func:`box_totals`) and
    ``owner_cost`` (that rate times the row's completion tokens) on each row and the totals. Unchanged when no cost is
    configured."""
    if not rates.known:
        return report
    tokens, joules = box
    seconds = max(0.0, min(float(report["until"]), now) - float(report["since"]))
    rate = per_million(window_cost(rates, seconds, joules), tokens)
    for row in (*report["rows"], report["totals"]):
        row["owner_cost_per_million"] = rate
        row["owner_cost"] = rate * int(row.get("completion_tokens") or 0) / 1e6 if rate is not None else None
    return report
